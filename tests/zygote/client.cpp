// hetseq-test-run: how ctest starts the test binary (its CROSSCOMPILING_EMULATOR), Note [Test zygote]
// (tests/support/zygote_server.cpp).
//   hetseq-test-run PROGRAM [ARGS...]   runs PROGRAM ARGS as a fork of PROGRAM's zygote where one serves, with
//                                        this process's descriptors 0-2, directory and environment, and leaves
//                                        as it does; runs PROGRAM itself (exec) where none does
//   hetseq-test-run --start PROGRAM     starts PROGRAM's zygote (PROGRAM --zygote SOCKET, detached), after
//                                        stopping one that runs; exits 0 also where none could start
//   hetseq-test-run --stop PROGRAM      asks the zygote to stop (it exits once its children have)
// HETSEQ_TEST_START=exec in the environment: PROGRAM runs itself, never through the zygote.

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "zygote/protocol.h"

extern char** environ;

namespace {

using namespace hetseq::test;

volatile sig_atomic_t g_child = 0;

void forward_signal(int sig) {
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
}

[[noreturn]] void exec_program(char** argv) {
  ::execv(argv[0], argv);
  std::fprintf(stderr, "hetseq-test-run: cannot run %s: %s\n", argv[0], std::strerror(errno));
  std::_Exit(127);
}

int connect_to(const std::string& path) {
  if (path.empty()) return -1;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends a request: the length with the descriptors 0-2 (a run), then the text (protocol.h).
bool send_request(int fd, const std::string& text, bool with_fds) {
  std::uint64_t length = text.size();
  iovec iov{&length, sizeof(length)};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (with_fds) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(3 * sizeof(int));
    const int fds[3] = {0, 1, 2};
    std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  }
  ssize_t n;
  do n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(sizeof(length)) && zygote::write_exactly(fd, text.data(), text.size());
}

void field(std::string& text, const std::string& value) {
  text += value;
  text.push_back('\0');
}

std::string absolute(const char* path) {
  char resolved[PATH_MAX];
  return ::realpath(path, resolved) != nullptr ? std::string(resolved) : std::string(path);
}

bool stop(const std::string& socket) {
  const int fd = connect_to(socket);
  if (fd < 0) return false;
  std::string text;
  field(text, "stop");
  send_request(fd, text, false);
  ::close(fd);
  return true;
}

int start(const std::string& program) {
  const std::string socket = zygote::socket_path(program);
  stop(socket);
  const pid_t first = ::fork();
  if (first == 0) {
    // Detached: a session of its own, no descriptor of ctest's (which waits for its pipes to close).
    ::setsid();
    if (::fork() != 0) std::_Exit(0);
    const std::string log = socket + ".log";
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    for (int fd = 3; fd < 1024; ++fd) ::close(fd);
    const std::string flag = "--zygote";
    std::vector<char*> argv{const_cast<char*>(program.c_str()), const_cast<char*>(flag.c_str()),
                            const_cast<char*>(socket.c_str()), nullptr};
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  if (first > 0) ::waitpid(first, nullptr, 0);
  // Up when it accepts a connection (a connection that sends nothing is dropped by it).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    const int fd = connect_to(socket);
    if (fd >= 0) {
      ::close(fd);
      std::printf("hetseq-test-run: the zygote of %s serves on %s\n", program.c_str(), socket.c_str());
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("hetseq-test-run: no zygote answered on %s within 60 s (its log: %s.log): tests start anew\n",
              socket.c_str(), socket.c_str());
  return 0;
}

int run(char** argv) {
  const char* start_env = std::getenv("HETSEQ_TEST_START");
  if (start_env != nullptr && std::string(start_env) == "exec") exec_program(argv);
  const std::string program = absolute(argv[0]);
  const int fd = connect_to(zygote::socket_path(program));
  if (fd < 0) exec_program(argv);
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) exec_program(argv);
  std::string text;
  field(text, "run");
  field(text, program);
  field(text, cwd);
  int argc = 0;
  while (argv[argc] != nullptr) ++argc;
  field(text, std::to_string(argc));
  field(text, program);
  for (int i = 1; i < argc; ++i) field(text, argv[i]);
  for (char** e = environ; *e != nullptr; ++e) field(text, *e);
  std::int64_t pid = 0;
  if (!send_request(fd, text, true) || !zygote::read_exactly(fd, &pid, sizeof(pid)) || pid == zygote::kRefused) {
    ::close(fd);
    exec_program(argv);
  }
  g_child = static_cast<sig_atomic_t>(pid);
  struct sigaction forward {};
  forward.sa_handler = forward_signal;
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::sigaction(s, &forward, nullptr);
  std::int64_t status = 0;
  if (!zygote::read_exactly(fd, &status, sizeof(status))) {
    std::fprintf(stderr, "hetseq-test-run: the zygote went away while it ran %s as pid %lld\n", argv[0],
                 static_cast<long long>(pid));
    return 125;
  }
  const int st = static_cast<int>(status);
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) {
    const int sig = WTERMSIG(st);
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return 128 + sig;
  }
  return 125;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--start") return start(absolute(argv[2]));
  if (argc >= 3 && std::string(argv[1]) == "--stop") {
    stop(zygote::socket_path(absolute(argv[2])));
    return 0;
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: hetseq-test-run PROGRAM [ARGS...] | --start PROGRAM | --stop PROGRAM\n");
    return 2;
  }
  return run(argv + 1);
}
