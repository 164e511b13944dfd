#pragma once
// A checkpoint save held at a known point, for tests that must act while a save is in progress (see
// Note [Save pause] in save_pause.cpp): a named pipe that the paused process waits on. The test holds the
// pipe (SavePause); the paused process runs save_pause_hook as its checkpoint_file_written test hook
// (Note [Test hooks], hetseq/core/test_hooks.cpp), which hetseq-train-hooked installs from kSavePauseEnv.

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>

namespace hetseq::test {

/// The variable that hetseq-train-hooked reads (support/hooked_train.h): HETSEQ_TEST_SAVE_PAUSE=FIFO:N, the value
/// of SavePause::at, holds the process's N-th checkpoint file write until FIFO is opened.
inline constexpr const char* kSavePauseEnv = "HETSEQ_TEST_SAVE_PAUSE";

class SavePause {
 public:
  /// Makes the named pipe at `fifo` (removed on destruction).
  explicit SavePause(std::string fifo);
  ~SavePause();
  SavePause(const SavePause&) = delete;
  SavePause& operator=(const SavePause&) = delete;

  /// The value of HETSEQ_TEST_SAVE_PAUSE (kSavePauseEnv) that pauses a process's `nth` checkpoint file write.
  std::string at(int nth) const;
  /// Lets the paused write go on; throws when no process has been waiting on the pipe within `deadline`.
  void release(std::chrono::seconds deadline = std::chrono::seconds(30)) const;

 private:
  std::string fifo_;
};

/// The checkpoint_file_written hook that `spec` ("FIFO:N", SavePause::at; "FIFO" alone is "FIFO:1") asks for:
/// the process's N-th checkpoint file write waits, with its bytes written, until FIFO is opened for writing and
/// closed. An empty `spec` gives no hook (an empty function). See Note [Save pause].
std::function<void(const std::filesystem::path&)> save_pause_hook(const std::string& spec);

}  // namespace hetseq::test
