#include "support/save_pause.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace hetseq::test {

SavePause::SavePause(std::string fifo) : fifo_(std::move(fifo)) {
  if (::mkfifo(fifo_.c_str(), 0600) != 0) {
    throw std::runtime_error("mkfifo " + fifo_ + ": " + std::strerror(errno));
  }
}

SavePause::~SavePause() { ::unlink(fifo_.c_str()); }

std::string SavePause::at(int nth) const { return fifo_ + ":" + std::to_string(nth); }

void SavePause::release(std::chrono::seconds deadline) const {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (true) {
    // Non-blocking: with no reader the open fails (ENXIO) instead of waiting for one forever.
    const int fd = ::open(fifo_.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) {
      ::close(fd);
      return;
    }
    if (errno != ENXIO || std::chrono::steady_clock::now() > end) {
      throw std::runtime_error("no process waits on " + fifo_ + ": " + std::strerror(errno));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace hetseq::test
