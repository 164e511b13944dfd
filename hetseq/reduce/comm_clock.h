#pragma once
/// The times of one update's bucket reductions, which the comm hooks write and DistributedReducer reads as
/// its ReductionTiming. Internal: not installed.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "hetseq/reduce/gradient_reducer.h"

namespace hetseq {

class Tracer;

namespace detail {

/// The times of one update's bucket allreduces: launches come from the autograd thread, completions
/// from the backend's threads.
struct CommClock {
  using Clock = std::chrono::steady_clock;

  void reset() {
    std::lock_guard<std::mutex> lock(mutex);
    launched = 0;
    bytes = 0;
    intervals.clear();
  }
  void on_launch(int64_t bucket_bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto now = Clock::now();
    if (launched++ == 0) {
      first_launch = now;
      last_done = now;
    }
    last_launch = now;
    bytes += bucket_bytes;
  }
  void on_done(Clock::time_point started) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto now = Clock::now();
    last_done = std::max(last_done, now);
    intervals.emplace_back(started, now);
  }
  ReductionTiming timing() {
    std::lock_guard<std::mutex> lock(mutex);
    ReductionTiming t;
    t.buckets = launched;
    t.bytes = bytes;
    if (launched > 0) {
      t.comm_s = std::chrono::duration<double>(last_done - first_launch).count();
      // The time at least one bucket was in flight: the union of the buckets' intervals.
      std::sort(intervals.begin(), intervals.end());
      Clock::time_point covered = intervals.empty() ? first_launch : intervals.front().first;
      for (const auto& [b, e] : intervals) {
        if (e <= covered) continue;
        t.busy_s += std::chrono::duration<double>(e - std::max(b, covered)).count();
        covered = e;
      }
      t.exposed_s = std::max(0.0, std::chrono::duration<double>(last_done - last_launch).count());
    }
    return t;
  }

  std::mutex mutex;
  int64_t launched = 0;
  int64_t bytes = 0;
  Clock::time_point first_launch, last_launch, last_done;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> intervals;  // [completed bucket] start, end
  std::shared_ptr<Tracer> tracer;  // bucket allreduce spans (Note [Tracing]); under `mutex`
  std::shared_ptr<Tracer> current_tracer() {
    std::lock_guard<std::mutex> lock(mutex);
    return tracer;
  }
};

}  // namespace detail

}  // namespace hetseq
