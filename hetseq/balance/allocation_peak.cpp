#include "hetseq/balance/allocation_peak.h"

#include <algorithm>
#include <atomic>
#include <memory>

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

namespace hetseq {
namespace {

// LibTorch's allocators report every allocation and free (negative sizes) to the memory reporter that
// is installed as the thread's PROFILER_STATE debug info, as its memory profiler does; this reporter keeps
// the running sum and its maximum.
class PeakReporter final : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, size_t /*total_allocated*/, size_t /*total_reserved*/,
                         c10::Device /*device*/) override {
    const int64_t now = current_.fetch_add(alloc_size) + alloc_size;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace

int64_t peak_allocated_bytes(const std::function<void()>& work) {
  auto reporter = std::make_shared<PeakReporter>();
  {
    const c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, reporter);
    work();
  }
  return reporter->peak();
}

}  // namespace hetseq
