#pragma once
// A checkpoint save held at a known point, for tests that must act while a save is in progress (see
// Note [Save pause] in hetseq/checkpoint/atomic_file.cpp): a named pipe that the paused process waits on.

#include <chrono>
#include <string>

namespace hetseq::test {

class SavePause {
 public:
  /// Makes the named pipe at `fifo` (removed on destruction).
  explicit SavePause(std::string fifo);
  ~SavePause();
  SavePause(const SavePause&) = delete;
  SavePause& operator=(const SavePause&) = delete;

  /// The value of HETSEQ_TEST_SAVE_PAUSE that pauses a process's `nth` atomic write.
  std::string at(int nth) const;
  /// Lets the paused write go on; throws when no process has been waiting on the pipe within `deadline`.
  void release(std::chrono::seconds deadline = std::chrono::seconds(30)) const;

 private:
  std::string fifo_;
};

}  // namespace hetseq::test
