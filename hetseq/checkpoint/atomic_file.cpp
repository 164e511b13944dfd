#include "hetseq/checkpoint/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

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

void write_file_atomically(const fs::path& path, const std::vector<char>& bytes, const std::string& flag) {
  const fs::path tmp = path.parent_path() / fmt::format(".{}{}{}", path.filename().string(), kTempMarker, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw InputError(fmt::format("{}: cannot create {} to write it: {}; check that {} is writable", path.string(),
                                 tmp.string(), std::strerror(errno), flag));
  }
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw InputError(fmt::format("{}: {} failed: {} (the previous file, if any, is unchanged)", path.string(), what,
                                 reason));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("writing");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync");
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
