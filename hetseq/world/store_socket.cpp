#include "hetseq/world/store_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {

// Note [The store's address]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// c10d's TCPStore server binds the wildcard address, whatever host the caller gives it: a store started for
// tcp://127.0.0.1:P is reachable from the whole network. Its options take a listening socket instead
// (masterListenFd), which the server adopts as it is. So rank 0 (or its node's launcher) binds the socket itself
// to the address the init method names, the first one it resolves to (as the ranks that connect resolve it), and
// hands it over: loopback stays loopback, and on a machine with several networks the store is on the one named.
// SO_REUSEADDR as c10d sets it, so that a port a previous run left in TIME_WAIT can be taken again.
// A host name that resolves to loopback on its own machine (Debian's /etc/hosts maps the machine's name to
// 127.0.1.1) puts the store where no other node reaches it, which c10d's wildcard hid: the store stays there, as
// named, and rank 0's machine says so in one warning, since the other nodes can only say that rank 0 never arrived.

namespace {

// The address `a` as text ("127.0.1.1").
std::string address_text(const sockaddr* a) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = nullptr;
  if (a->sa_family == AF_INET6) {
    raw = &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
  } else {
    raw = &reinterpret_cast<const sockaddr_in*>(a)->sin_addr;
  }
  ::inet_ntop(a->sa_family, raw, text, sizeof(text));
  return text;
}

// Whether `a` is a loopback address (127.0.0.0/8, ::1).
bool is_loopback_address(const sockaddr* a) {
  if (a->sa_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  return false;
}

}  // namespace

int bind_store_socket(const std::string& host, uint16_t port, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_ADDRCONFIG;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    throw InputError(fmt::format("{}: cannot resolve '{}' for the rendezvous store: {}", what, host, ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(found, ::freeaddrinfo);
  int last_error = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = errno;
      continue;
    }
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 2048) == 0) {
      if (is_loopback_address(a->ai_addr) && !is_loopback_host(host)) {
        log::warn("[rendezvous] '{}' is {} on this machine, a loopback address: the store listens there only, where no "
                  "other machine reaches it ({}); name this machine by an address the other nodes reach, or map its "
                  "name to that address in /etc/hosts",
                  host, address_text(a->ai_addr), what);
      }
      return fd;
    }
    last_error = errno;
    ::close(fd);
  }
  throw InputError(fmt::format("{}: cannot host the rendezvous store on {}:{}: {} (is the address this machine's, and "
                               "the port free?)",
                               what, host, port, std::strerror(last_error)));
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return false;
}

}  // namespace hetseq
