#include "fuzz/scratch_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace hetseq::fuzz {

ScratchFile::ScratchFile(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path dir =
      std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
          ? std::filesystem::path("/dev/shm")
          : std::filesystem::temp_directory_path();
  path_ = (dir / ("hetseq-fuzz-" + std::to_string(::getpid()) + "-" + name)).string();
}

ScratchFile::~ScratchFile() { ::unlink(path_.c_str()); }

const std::string& ScratchFile::write(const uint8_t* data, size_t size) {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(path_ + ": cannot create the scratch file: " + std::strerror(errno));
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(path_ + ": cannot write the scratch file: " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path_;
}

}  // namespace hetseq::fuzz
