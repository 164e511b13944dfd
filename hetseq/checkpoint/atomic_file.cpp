#include "hetseq/checkpoint/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/test_hooks.h"

namespace hetseq {
namespace fs = std::filesystem;
namespace {

constexpr const char* kTempMarker = ".hetseq-tmp-";

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // some filesystems do not open directories; the rename is done anyway
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

bool FileSink::fail(const char* what, int error) noexcept {
  if (error_ == 0) {
    error_ = error;
    what_ = what;
  }
  return false;
}

std::string FileSink::error() const {
  return failed() ? fmt::format("{} failed: {}", what_, std::strerror(error_)) : std::string();
}

bool FileSink::write(const void* data, size_t n) noexcept {
  if (failed()) return false;
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t done = ::write(fd_, p, n);
    if (done < 0) {
      if (errno == EINTR) continue;
      return fail("writing", errno);
    }
    p += done;
    n -= static_cast<size_t>(done);
  }
  return true;
}

bool FileSink::append_file(int fd) noexcept {
  if (failed()) return false;
  for (;;) {
    const ssize_t done = ::copy_file_range(fd, nullptr, fd_, nullptr, size_t{1} << 30, 0);
    if (done == 0) return true;
    if (done > 0) continue;
    if (errno == EINTR) continue;
    // Filesystems and kernels that do not copy between these files: copy through a buffer instead.
    if (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL) break;
    return fail("copying", errno);
  }
  std::unique_ptr<char[]> buffer(new (std::nothrow) char[size_t{1} << 20]);
  if (buffer == nullptr) return fail("copying", ENOMEM);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.get(), size_t{1} << 20);
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("reading", errno);
    }
    if (!write(buffer.get(), static_cast<size_t>(n))) return false;
  }
}

void write_file_atomically(const fs::path& path, const std::function<void(FileSink&)>& write,
                           const std::string& flag) {
  const fs::path tmp = path.parent_path() / fmt::format(".{}{}{}", path.filename().string(), kTempMarker, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw InputError(fmt::format("{}: cannot create {} to write it: {}; check that {} is writable", path.string(),
                                 tmp.string(), std::strerror(errno), flag));
  }
  auto discard = [&] {
    ::close(fd);
    ::unlink(tmp.c_str());
  };
  auto fail = [&](const std::string& what) {
    discard();
    throw InputError(fmt::format("{}: {} (the previous file, if any, is unchanged)", path.string(), what));
  };
  FileSink sink(fd);
  try {
    write(sink);
  } catch (...) {
    discard();
    throw;
  }
  if (sink.failed()) fail(sink.error());
  if (::fsync(fd) != 0) fail(fmt::format("fsync failed: {}", std::strerror(errno)));
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw InputError(fmt::format("{}: closing the temporary file failed: {}", path.string(), std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(fmt::format("{}: renaming {} over it failed: {}", path.string(), tmp.string(), reason));
  }
  fsync_directory(path.parent_path());
}

void write_file_atomically(const fs::path& path, const std::vector<char>& bytes, const std::string& flag) {
  write_file_atomically(path, [&](FileSink& sink) { sink.write(bytes.data(), bytes.size()); }, flag);
}

void copy_file_atomically(const fs::path& from, const fs::path& to, const std::string& flag) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) {
    throw InputError(fmt::format("{}: cannot open it to copy it to {}: {}", from.string(), to.string(),
                                 std::strerror(errno)));
  }
  try {
    write_file_atomically(to, [&](FileSink& sink) {
      sink.append_file(in);
      detail::run_checkpoint_file_written_hook(to);  // a test's hold: Note [Test hooks]
    }, flag);
  } catch (...) {
    ::close(in);
    throw;
  }
  ::close(in);
}

int remove_stale_temporaries(const fs::path& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!name.empty() && name[0] == '.' && name.find(kTempMarker) != std::string::npos) {
      if (::unlink((dir / name).c_str()) == 0) ++removed;
    }
  }
  ::closedir(d);
  return removed;
}

std::vector<char> read_file(const fs::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw InputError(fmt::format("{}: cannot open: {}; check the path", path.string(), std::strerror(errno)));
  }
  std::vector<char> bytes;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw InputError(fmt::format("{}: read error; check the file", path.string()));
  return bytes;
}

void ensure_writable_dir(const fs::path& dir, const std::string& flag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw InputError(fmt::format("{} {}: cannot create the directory ({}); choose a writable path", flag,
                                 dir.string(), ec ? ec.message() : "a file of that name exists"));
  }
  const fs::path probe = dir / fmt::format(".hetseq-write-test-{}", ::getpid());
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  if (f == nullptr) {
    throw InputError(fmt::format("{} {}: cannot write into the directory ({}); choose a writable path", flag,
                                 dir.string(), std::strerror(errno)));
  }
  std::fclose(f);
  fs::remove(probe, ec);
}

}  // namespace hetseq
