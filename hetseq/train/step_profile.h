#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <c10/core/Device.h>

#include "hetseq/observe/compute_timer.h"
#include "hetseq/observe/op_counter.h"
#include "hetseq/train/training_observer.h"

namespace hetseq {

/// What --step-profile WARMUP,TIMED asks for.
struct StepProfileOptions {
  int64_t warmup = 20;  // (at least 1) updates trained before the timed ones, excluded from every figure
  int64_t timed = 0;    // updates timed (0: no profile)
  c10::Device device = c10::kCPU;
  int64_t rank = 0;  // rank 0 prints the JSON line
};

/// The figures of a step profile (Note [Step profile]).
struct StepProfileResult {
  int64_t warmup_updates = 0;
  int64_t timed_updates = 0;
  int64_t samples = 0;             // every rank's samples over the timed updates
  double seconds = 0;              // the timed span, on the device's clock
  double samples_per_s = 0;
  double data_wait_ms = 0;         // medians over the timed updates, per update
  double host_ms = 0;
  double device_ms = 0;
  double aten_ops_per_update = 0;  // Note [Counting operators]
  double aten_top_ops_per_update = 0;
  double host_reads_per_update = 0;
  int64_t peak_memory_bytes = 0;   // the device's peak allocation (CUDA), or the process's peak RSS (CPU)
  int64_t peak_reserved_bytes = 0; // the caching allocator's peak reservation (CUDA; 0 on a CPU)
  int64_t replayed_updates = 0;    // timed updates that replayed a CUDA graph (Note [CUDA-graph updates])
  const char* clock = "";
};

// Note [Step profile]
// ~~~~~~~~~~~~~~~~~~~
// A throughput figure is only worth its method. --step-profile W,T lets W updates pass (start-up: the first
// allocations, the allocator's caches, cuDNN's and cuBLAS's choices, the loader filling its queue), then
// measures T updates in the steady state:
// - the span: from the end of update W to the end of update W+T, on the device's clock (CUDA events on a
//   GPU, which the host reads once, after the last timed update; the host clock on a CPU). Samples per
//   second are every rank's samples of those updates over that span.
// - per update, medians: the data wait (the loop blocked on the loader), the host time (the whole update
//   on the host, data included) and the device time (the training loop's compute clock: Note [Compute
//   timing]). A host time near the device time says the device waits for the host (launch-bound);
//   a host time far below it says the host runs ahead, as it should.
// - ATen operators and host reads per update, counted on the training thread and autograd's threads by a
//   RecordFunction callback (Note [Counting operators]); the loop's own work between updates (logging,
//   observers) is inside the span and is counted.
// - peak memory: CUDA's caching allocator's peak on a GPU; the process's peak resident set on a CPU.
// One JSON line, {"tag":"step_profile",...}, on rank 0. A run that ends before W+T updates says so in one
// line and prints nothing else.

/// Measures the steady state of a run as Note [Step profile] says, watching the loop's updates.
class StepProfile final : public TrainingObserver {
 public:
  explicit StepProfile(StepProfileOptions options);
  void on_update(const UpdateRecord& record) override;
  void on_train_end(int64_t last_epoch, int64_t num_updates) override;
  /// The figures, once the timed updates are done.
  const std::optional<StepProfileResult>& result() const { return result_; }

 private:
  void finish();

  StepProfileOptions options_;
  int64_t seen_ = 0;
  int64_t samples_ = 0;
  int64_t replayed_ = 0;
  std::vector<double> data_s_, host_s_, device_s_;  // [timed update]
  std::unique_ptr<OpCounter> counter_;
  std::unique_ptr<ComputeTimer> timer_;
  std::optional<StepProfileResult> result_;
};

/// The JSON line of a step profile.
std::string step_profile_json(const StepProfileResult& result, int64_t rank);

}  // namespace hetseq
