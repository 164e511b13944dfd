#pragma once
// Counting a thread's host syncs with CUDA's sync debug mode (the CUDA tests).

#include <string>

#ifdef HETSEQ_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

namespace hetseq::test {

/// Counts CUDA's "called a synchronizing CUDA operation" warnings, which sync-debug mode "warn" raises at every
/// host sync (an .item(), a blocking copy, a nonzero), on the thread that makes it (the warning handler is the
/// thread's own) while it lives; other warnings go on to the handler that was there before. With `set_mode`, it
/// sets the process-wide mode to "warn" for its life; without, the caller does (several threads counting at once).
class SyncCounter : public c10::WarningHandler {
 public:
  explicit SyncCounter(bool set_mode = true) : previous_(c10::WarningUtils::get_warning_handler()), set_mode_(set_mode) {
    c10::WarningUtils::set_warning_handler(this);
    if (set_mode_) c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  }
  ~SyncCounter() override {
    if (set_mode_) c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    c10::WarningUtils::set_warning_handler(previous_);
  }
  SyncCounter(const SyncCounter&) = delete;
  SyncCounter& operator=(const SyncCounter&) = delete;

  void process(const c10::Warning& warning) override {
    if (warning.msg().find("called a synchronizing CUDA operation") != std::string::npos) {
      ++syncs;
    } else {
      previous_->process(warning);
    }
  }
  int64_t syncs = 0;

 private:
  c10::WarningHandler* previous_;
  bool set_mode_;
};

}  // namespace hetseq::test
#endif
