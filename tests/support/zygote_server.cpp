#include "support/zygote_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "support/subprocess.h"
#include "zygote/protocol.h"

extern char** environ;

namespace hetseq::test {
namespace {

// Note [Test zygote]
// ~~~~~~~~~~~~~~~~~~
// Starting this test binary costs about 0.6 s of CPU before main() (LibTorch's operator registration and
// the mapping of its libraries), and ctest starts it once per multi-process test: some 130 times, about a
// sixth of the suite's CPU. So ctest runs it through hetseq-test-run (tests/zygote/client.cpp, the target's
// CROSSCOMPILING_EMULATOR), and a fixture test starts one copy of the binary as a zygote: it has paid the
// start, runs nothing, and forks a child per test, which runs main() on from where a new process would.
//  - The child gets what exec would give it: the client's descriptors 0-2 (passed over the socket), working
//    directory and environment, a session of its own, default signal handlers and an empty signal mask.
//    Everything main() does before Catch2 (set-up that reads or sets the environment) runs in the child.
//  - The zygote forks only while it runs one thread, as every fork of a LibTorch process here must (Note
//    [Forked test programs], subprocess.cpp): it never touches LibTorch, CUDA included, so a GPU machine's
//    child initialises CUDA itself.
//  - The client waits for the child's status and leaves with it (a signal by raising it); a signal that the
//    client gets goes on to the child; a client that dies (ctest's timeout kills it) takes its child's process
//    tree with it, as ctest's kill would have, since the zygote watches the client's socket.
//  - A child is one test process as ctest would start it, so the rule that only a process's first test case
//    forks programs (Note [Forked test programs]) holds in it as before.
//  - Where there is no zygote (a test run alone, HETSEQ_TEST_START=exec, a binary rebuilt since the zygote
//    started: it refuses and exits), the client execs the binary itself.

bool g_started_by_zygote = false;

struct Client {
  int fd = -1;     // -1 once the client is gone
  pid_t child = -1;
};

void send_int(int fd, std::int64_t value) { zygote::write_exactly(fd, &value, sizeof(value)); }

struct Request {
  std::string kind, program, cwd;
  std::vector<std::string> argv, env;
  std::vector<int> fds;  // the client's 0, 1, 2 (a run)
};

void close_fds(const std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
}

// Reads one request from a client just accepted; false where it is malformed (the caller closes r.fds).
bool read_request(int fd, Request& r) {
  const timeval timeout{zygote::kRequestTimeoutS, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::uint64_t length = 0;
  iovec iov{&length, sizeof(length)};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      r.fds.resize(count);
      std::memcpy(r.fds.data(), CMSG_DATA(c), count * sizeof(int));
    }
  }
  if (n != static_cast<ssize_t>(sizeof(length))) {
    if (n > 0) {
      // The rest of a short read of the length.
      if (!zygote::read_exactly(fd, reinterpret_cast<char*>(&length) + n, sizeof(length) - static_cast<size_t>(n))) {
        n = -1;
      }
    }
    if (n <= 0) return false;
  }
  if (length == 0 || length > zygote::kMaxRequestBytes) return false;
  std::string text(length, '\0');
  if (!zygote::read_exactly(fd, text.data(), text.size())) return false;
  std::vector<std::string> fields;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\0', at);
    if (end == std::string::npos) return false;
    fields.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (fields.empty()) return false;
  r.kind = fields[0];
  if (r.kind == "stop") return true;
  if (r.kind != "run" || fields.size() < 4 || r.fds.size() != 3) return false;
  r.program = fields[1];
  r.cwd = fields[2];
  const size_t argc = std::strtoul(fields[3].c_str(), nullptr, 10);
  if (argc == 0 || fields.size() < 4 + argc) return false;
  r.argv.assign(fields.begin() + 4, fields.begin() + 4 + static_cast<std::ptrdiff_t>(argc));
  r.env.assign(fields.begin() + 4 + static_cast<std::ptrdiff_t>(argc), fields.end());
  return true;
}

// In the child: becomes the process that exec would have made of the request (Note [Test zygote]).
void become_request(const Request& r, int listen_fd, const std::vector<Client>& clients, int client_fd) {
  ::close(listen_fd);
  for (const Client& c : clients) {
    if (c.fd >= 0) ::close(c.fd);
  }
  ::close(client_fd);
  ::setsid();
  for (int i = 0; i < 3; ++i) {
    if (r.fds[static_cast<size_t>(i)] != i) ::dup2(r.fds[static_cast<size_t>(i)], i);  // dup2 clears FD_CLOEXEC
  }
  for (int fd : r.fds) {
    if (fd > 2) ::close(fd);
  }
  if (::chdir(r.cwd.c_str()) != 0) {
    std::fprintf(stderr, "test zygote: cannot enter %s: %s\n", r.cwd.c_str(), std::strerror(errno));
    std::_Exit(127);
  }
  ::clearenv();
  for (const std::string& kv : r.env) ::putenv(::strdup(kv.c_str()));
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  g_started_by_zygote = true;
}

// The processes under `root` (itself first), from the parent pids in /proc.
std::vector<pid_t> process_tree(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, its parent)
  if (DIR* d = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(d)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      const auto fields = pid > 0 ? proc_stat_fields(pid) : std::nullopt;
      int ppid = 0;
      if (fields && std::sscanf(fields->c_str(), "%*c %d", &ppid) == 1) parent_of.emplace_back(pid, ppid);
    }
    ::closedir(d);
  }
  std::vector<pid_t> tree{root};
  for (size_t i = 0; i < tree.size(); ++i) {
    for (const auto& [pid, ppid] : parent_of) {
      if (ppid == tree[i]) tree.push_back(pid);
    }
  }
  return tree;
}

// What ctest does to a test that overran (it kills the test's process tree): stopped first, so that none
// forks or leaves its parent while the tree is read again, then killed.
void kill_tree(pid_t root) {
  for (pid_t pid : process_tree(root)) ::kill(pid, SIGSTOP);
  for (pid_t pid : process_tree(root)) ::kill(pid, SIGKILL);
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

}  // namespace

bool started_by_zygote() { return g_started_by_zygote; }

std::optional<std::vector<std::string>> serve_as_zygote(const std::string& socket_path) {
  struct stat self {};
  if (::stat("/proc/self/exe", &self) != 0) return std::nullopt;
  const int listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (listen_fd < 0 || socket_path.size() >= sizeof(addr.sun_path)) return std::nullopt;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  ::unlink(socket_path.c_str());
  if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd, 64) != 0) {
    std::fprintf(stderr, "test zygote: cannot listen on %s: %s\n", socket_path.c_str(), std::strerror(errno));
    return std::nullopt;
  }
  struct stat socket_file {};
  ::stat(socket_path.c_str(), &socket_file);
  std::fprintf(stderr, "test zygote: pid %d serving on %s\n", ::getpid(), socket_path.c_str());
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<Client> clients;
  bool stopping = false;
  auto last_activity = std::chrono::steady_clock::now();
  for (;;) {
    // Children that ended: their status to their clients.
    int status = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      for (auto it = clients.begin(); it != clients.end(); ++it) {
        if (it->child != pid) continue;
        if (it->fd >= 0) {
          send_int(it->fd, status);
          ::close(it->fd);
        }
        clients.erase(it);
        break;
      }
      last_activity = std::chrono::steady_clock::now();
    }
    const bool idle = std::chrono::steady_clock::now() - last_activity > std::chrono::seconds(zygote::kIdleExitS);
    if (clients.empty() && (stopping || idle)) break;

    std::vector<pollfd> fds;
    fds.push_back({stopping ? -1 : listen_fd, POLLIN, 0});
    for (const Client& c : clients) fds.push_back({c.fd, POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), 100);
    if (ready <= 0) continue;
    // A client that is gone (EOF; it sends nothing after its request): its child's process tree is killed.
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      Client& c = clients[i - 1];
      ::close(c.fd);
      c.fd = -1;
      kill_tree(c.child);
    }
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    last_activity = std::chrono::steady_clock::now();
    Request r;
    if (!read_request(fd, r)) {
      close_fds(r.fds);
      ::close(fd);
      continue;
    }
    if (r.kind == "stop") {
      stopping = true;
      ::close(fd);
      continue;
    }
    // A binary rebuilt since this zygote started: the client runs it anew, and this zygote stops.
    struct stat program {};
    if (::stat(r.program.c_str(), &program) != 0 || !same_file(program, self)) {
      send_int(fd, zygote::kRefused);
      ::close(fd);
      close_fds(r.fds);
      stopping = true;
      continue;
    }
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child == 0) {
      become_request(r, listen_fd, clients, fd);
      return r.argv;
    }
    close_fds(r.fds);
    if (child < 0) {
      send_int(fd, zygote::kRefused);
      ::close(fd);
      continue;
    }
    send_int(fd, child);
    clients.push_back({fd, child});
  }
  ::close(listen_fd);
  // The socket file is removed only while it is still this zygote's (a new zygote may have replaced it).
  struct stat now {};
  if (::stat(socket_path.c_str(), &now) == 0 && now.st_ino == socket_file.st_ino) ::unlink(socket_path.c_str());
  std::fprintf(stderr, "test zygote: pid %d stopped\n", ::getpid());
  return std::nullopt;
}

}  // namespace hetseq::test
