#include "support/save_pause.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
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

// Note [Save pause]
// ~~~~~~~~~~~~~~~~~
// Tests of what happens while a save is in progress (a kill that must leave the previous checkpoint
// loadable, a save slower than the collective timeout) need the save to be in progress when they act,
// whatever the disk's speed or the machine's load; a random delay hits it only by luck. The library's
// checkpoint_file_written test hook (Note [Test hooks], hetseq/core/test_hooks.cpp) runs at every checkpoint
// file write once the temporary file holds all its bytes, before it is synced and renamed over the target.
// With HETSEQ_TEST_SAVE_PAUSE=FIFO:N in its environment, hetseq-train-hooked (support/hooked_train.h) installs
// save_pause_hook there: the process's N-th checkpoint file write stops at that point, says so on stderr
// ("[save-pause] ..."), and waits until someone opens FIFO (a named pipe) for writing and closes it
// (SavePause::release, or a kill). Every file of a save counts: save_checkpoint writes the first name
// (checkpoint_E_N.pt or checkpointE.pt) and copies it to the others (checkpoint_best.pt, checkpoint_last.pt),
// so a save of two files is writes 2k-1 and 2k, and a test can hold the very write of checkpoint_last.pt;
// with sharded optimizer state the shard files and manifests count too (tests/shard/
// test_sharded_checkpoint.cpp lists a save's writes). Every later write goes through. The writes are counted
// per process: a process forked from one with the hook (a launcher's forked worker) counts from zero.
std::function<void(const std::filesystem::path&)> save_pause_hook(const std::string& spec) {
  if (spec.empty()) return {};
  const size_t colon = spec.rfind(':');
  const std::string fifo = colon == std::string::npos ? spec : spec.substr(0, colon);
  const int nth = colon == std::string::npos ? 1 : std::atoi(spec.c_str() + colon + 1);
  return [fifo, nth, counting = pid_t{0}, writes = 0](const std::filesystem::path& path) mutable {
    if (counting != ::getpid()) {  // the process whose writes `writes` counts
      counting = ::getpid();
      writes = 0;
    }
    if (++writes != nth) return;
    std::fprintf(stderr, "[save-pause] pid %d: checkpoint write %d (%s) paused with its bytes written, not yet "
                 "renamed; open %s to go on\n",
                 static_cast<int>(::getpid()), writes, path.c_str(), fifo.c_str());
    std::fflush(stderr);
    const int fd = ::open(fifo.c_str(), O_RDONLY);  // blocks until a writer opens it
    if (fd < 0) return;
    char byte = 0;
    while (::read(fd, &byte, 1) > 0) {
    }
    ::close(fd);
  };
}

}  // namespace hetseq::test
