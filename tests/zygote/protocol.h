#pragma once
// What hetseq-test-run (tests/zygote/client.cpp) and the test binary's zygote (support/zygote_server.cpp)
// say to each other over a Unix socket beside the test binary: Note [Test zygote] (support/zygote_server.cpp).
// Plain C++ and POSIX: the client links nothing of LibTorch, so that it starts in a millisecond.
//
// A request is one sendmsg of a std::uint64_t, the length of the text that follows, carrying the client's
// descriptors 0, 1 and 2 (SCM_RIGHTS) for a "run"; then the text: NUL-terminated fields, the kind ("run"
// or "stop"), the program's path, the working directory, the count of arguments, the arguments (argv[0]
// first), then the environment's "KEY=VALUE" strings to the end. The zygote answers a run with two
// std::int64_t: the child's pid (or kRefused: the client then runs the program itself), then its wait status.

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace hetseq::test::zygote {

inline constexpr std::int64_t kRefused = -1;
/// The most text a request may carry (the environment of a test is a few kilobytes).
inline constexpr std::uint64_t kMaxRequestBytes = 1 << 20;
/// How long the zygote waits for a connected client's request before it drops it.
inline constexpr int kRequestTimeoutS = 10;
/// A zygote with no child and no request for this long exits (one left by a run that was killed).
inline constexpr int kIdleExitS = 900;

/// The zygote's socket for the test binary at `program` (an absolute path): a file beside it, or, where that path
/// is too long for a Unix socket's address (about 100 bytes), one in /tmp named by a hash of the program's path.
inline std::string socket_path(const std::string& program) {
  const auto slash = program.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : program.substr(0, slash);
  const std::string base = slash == std::string::npos ? program : program.substr(slash + 1);
  std::string path = dir + "/." + base + ".zygote";
  if (path.size() < 100) return path;
  return "/tmp/.hetseq-tests-" + std::to_string(std::hash<std::string>{}(program)) + ".zygote";
}

/// Reads exactly `size` bytes (retrying after signals); false at EOF or an error.
inline bool read_exactly(int fd, void* data, std::size_t size) {
  char* at = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, at, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

/// Sends exactly `size` bytes (retrying after signals; no SIGPIPE when the other side is gone); false on an error.
inline bool write_exactly(int fd, const void* data, std::size_t size) {
  const char* at = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, at, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace hetseq::test::zygote
