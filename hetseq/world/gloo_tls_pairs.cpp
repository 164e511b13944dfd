#include "hetseq/world/gloo_tls_pairs.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/world/gloo_tls_transport.h"

namespace hetseq {

// Note [Gloo's TLS pairs]
// ~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch's Gloo has a TCP_TLS transport (Note [Gloo over TLS]), but in the Gloo it carries a TLS context makes
// plain TCP pairs: the context's way of connecting every peer (createAndConnectAllPairs, which publishes one
// address and a sequence number per pair) is the TCP context's, and it makes each pair through a two-argument
// createPair that is not virtual, so the TLS context's own createPair(rank), which makes a TLS pair, is never
// called. The handshake never happens and the gradients cross the network in clear, although both TLS contexts
// were made and read their keys. A capture of the pairs' first bytes on a virtual Ethernet link between two
// network namespaces showed it, from hetseq and from PyTorch's own GLOO_DEVICE_TRANSPORT=TCP_TLS route alike.
//
// Gloo's generic context connects through the virtual createPair(rank): each rank publishes the addresses of its
// pairs in the store and connects each pair to its peer's (the way Gloo's contexts connected before the TCP
// context's own, cheaper exchange). So hetseq points the TLS context's virtual table, in this process, at the
// generic way for that one entry; nothing else of Gloo changes, and plain TCP contexts keep their own way. The
// entry is found by value: the TLS context's table (an exported symbol, whose size the dynamic symbol table gives)
// must hold the TCP context's createAndConnectAllPairs exactly once and the TLS context's createPair(rank), both
// found by their exported names. Anything else (a Gloo whose TLS context has a way of its own, a table of another
// shape) is refused with one line, rather than guessed: hetseq would rather stop than send in clear what a secret
// was given to seal. The table's page is made writable for the one store and read-only again.
//
// What proves it: tests/world/test_gloo_tls.cpp captures the first bytes of every pair between two ranks in two
// network namespaces (a TLS record, 16 03, after the sequence number that Gloo's listener reads in clear to route
// the connection) and trains to the same parameters as plain Gloo, bit for bit.

namespace {

constexpr const char* kTlsContextTable = "_ZTVN4gloo9transport3tcp3tls7ContextE";
constexpr const char* kTcpConnectAll = "_ZN4gloo9transport3tcp7Context24createAndConnectAllPairsESt10shared_ptrINS_6IStoreEE";
constexpr const char* kGenericConnectAll = "_ZN4gloo9transport7Context24createAndConnectAllPairsESt10shared_ptrINS_6IStoreEE";
constexpr const char* kTlsCreatePair = "_ZN4gloo9transport3tcp3tls7Context10createPairEi";

[[noreturn]] void refuse(const std::string& why) {
  throw InputError(fmt::format(
      "--distributed-secret-file: the Gloo in this LibTorch cannot be checked to encrypt its connections ({}); "
      "hetseq will not send in clear what the secret seals. Use the torch wheel that scripts/setup.sh pins, or "
      "run these ranks on one machine (tcp://127.0.0.1), whose connections stay on loopback",
      why));
}

// The library that holds Gloo (LibTorch's CPU library), found through the TLS transport's factory that hetseq
// links: RTLD_DEFAULT would not see it where it was loaded locally (Python's torch module).
void* gloo_library() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&::gloo::transport::tcp::tls::CreateDevice), &info) == 0 ||
      info.dli_fname == nullptr) {
    refuse("no library holds its TLS transport");
  }
  void* handle = ::dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) refuse(fmt::format("{} is not loaded", info.dli_fname));
  return handle;  // kept: the library stays for the process's life
}

void* symbol(void* library, const char* name) {
  void* address = ::dlsym(library, name);
  if (address == nullptr) refuse(fmt::format("no symbol {}", name));
  return address;
}

void route_once() {
  void* const library = gloo_library();
  void* table = symbol(library, kTlsContextTable);
  Dl_info info{};
  void* extra = nullptr;
  const bool known = ::dladdr1(table, &info, &extra, RTLD_DL_SYMENT) != 0;
  const auto* entry = static_cast<const ElfW(Sym)*>(extra);
  if (!known || entry == nullptr ||
      entry->st_size < 4 * sizeof(void*) || entry->st_size % sizeof(void*) != 0) {
    refuse("the TLS context's virtual table has no size");
  }
  void* const tcp_connect = symbol(library, kTcpConnectAll);
  void* const generic_connect = symbol(library, kGenericConnectAll);
  void* const tls_create_pair = symbol(library, kTlsCreatePair);
  // Two words (offset to top, type info) before the functions.
  auto** slots = static_cast<void**>(table) + 2;
  const size_t count = entry->st_size / sizeof(void*) - 2;
  size_t found = count, tcp_hits = 0, create_hits = 0;
  for (size_t i = 0; i < count; ++i) {
    if (slots[i] == tcp_connect) {
      found = i;
      ++tcp_hits;
    } else if (slots[i] == generic_connect) {
      return;  // routed already (another copy of this library in the process did it)
    }
    create_hits += slots[i] == tls_create_pair;
  }
  if (tcp_hits != 1 || create_hits != 1) {
    refuse(fmt::format("its TLS context's table holds the TCP way of connecting {} times and its own pair maker {} "
                       "times, where hetseq knows once and once",
                       tcp_hits, create_hits));
  }
  const long page = ::sysconf(_SC_PAGESIZE);
  auto* start = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(&slots[found]) & ~static_cast<uintptr_t>(page - 1));
  if (::mprotect(start, static_cast<size_t>(page), PROT_READ | PROT_WRITE) != 0) {
    refuse("its TLS context's table cannot be made writable");
  }
  slots[found] = generic_connect;
  ::mprotect(start, static_cast<size_t>(page), PROT_READ);
  log::debug("[process-group] Gloo's TLS contexts connect through TLS pairs (Note [Gloo's TLS pairs])");
}

}  // namespace

void route_gloo_tls_pairs() {
  static std::once_flag once;
  std::call_once(once, route_once);
}

}  // namespace hetseq
