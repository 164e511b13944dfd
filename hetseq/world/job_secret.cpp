#include "hetseq/world/job_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

// Note [A job's secret]
// ~~~~~~~~~~~~~~~~~~~~~
// The ranks of a job prove to each other that they belong to it by holding one secret: 32 bytes from the
// operating system's random source, written by `hetseq-train --make-secret PATH` as 64 hexadecimal digits in a
// file created with O_EXCL and mode 0600, so that no other local user reads it and no existing file is replaced.
// Every node reads the same file (a shared filesystem suits it, as --save-dir does) through
// --distributed-secret-file, or HETSEQ_SECRET_FILE where a launcher starts the ranks. A file that its group or
// others may read is refused: on a shared filesystem that would hand the job to every user of the lab.
//
// The secret is never used directly: each use takes its own key, HMAC-SHA256(secret, "hetseq/" + purpose)
// (derive), so the key that seals the store's values (Note [Sealed store]) and any other are unrelated.

namespace {

std::string hex(const uint8_t* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 15]);
  }
  return out;
}

int nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// How a line names the file: "--distributed-secret-file PATH", or "HETSEQ_SECRET_FILE=PATH" where the environment
// gave it (`flag` then ends with '=').
std::string named(const std::string& flag, const std::string& path) {
  return !flag.empty() && flag.back() == '=' ? flag + path : flag + " " + path;
}

}  // namespace

JobSecret JobSecret::load(const std::string& path, const std::string& flag) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw UsageError(fmt::format("{}: {}; make one with hetseq-train --make-secret {} and give every node the same "
                                 "file",
                                 named(flag, path), std::strerror(errno), path));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    throw UsageError(fmt::format("{}: the file may be read by others (mode {:04o}); the job's secret must be its "
                                 "owner's alone: chmod 600 {}",
                                 named(flag, path), st.st_mode & 07777, path));
  }
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) {
    throw UsageError(fmt::format("{}: cannot read the file (it is empty or unreadable)", named(flag, path)));
  }
  JobSecret s;
  s.path_ = path;
  s.source_ = named(flag, path);
  if (text.size() != 64) {
    throw UsageError(fmt::format("{}: not a secret of hetseq-train --make-secret (64 hexadecimal digits on the "
                                 "first line; it holds {} characters)",
                                 named(flag, path), text.size()));
  }
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      throw UsageError(fmt::format("{}: not a secret of hetseq-train --make-secret (a character that is not a "
                                   "hexadecimal digit at position {})",
                                   named(flag, path), 2 * i + (hi < 0 ? 1 : 2)));
    }
    s.bytes_[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return s;
}

void JobSecret::make(const std::string& path) {
  std::array<uint8_t, 32> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    throw InternalError("--make-secret: the random source failed");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    throw UsageError(fmt::format("--make-secret {}: {}{}", path, std::strerror(err),
                                 err == EEXIST ? "; a secret is never written over a file: choose a new path, or "
                                                 "delete the old secret once no job uses it"
                                               : ""));
  }
  const std::string line = hex(bytes.data(), bytes.size()) + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    throw UsageError(fmt::format("--make-secret {}: cannot write the file", path));
  }
}

std::array<uint8_t, 32> JobSecret::derive(const std::string& purpose) const {
  const std::string label = "hetseq/" + purpose;
  std::array<uint8_t, 32> out{};
  unsigned int n = 0;
  HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()), reinterpret_cast<const unsigned char*>(label.data()),
       label.size(), out.data(), &n);
  HETSEQ_ASSERT(n == out.size(), "HMAC-SHA256 gave {} bytes", n);
  return out;
}

}  // namespace hetseq
