#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>

#include <c10/core/Device.h>

namespace hetseq {

/// Times intervals of compute on one rank's device: the host's steady clock on a CPU rank, a pair of
/// CUDA events on a CUDA rank (make_compute_timer picks). The training loop times each update's
/// forward, backward and step with it, for the balancer's cost model. See Note [Compute timing].
class ComputeTimer {
 public:
  virtual ~ComputeTimer() = default;
  /// Marks the start of an interval, before its first operation is issued.
  virtual void start() = 0;
  /// Marks its end, after its last operation is issued.
  virtual void stop() = 0;
  /// Whether seconds() can answer without waiting for the device (always, on the host clock).
  virtual bool ready() const = 0;
  /// Seconds from the last start() to the last stop(), as the device ran them; waits for the device to
  /// reach stop() when ready() is false.
  virtual double seconds() = 0;
  /// What it measures with, for logs and tests: "host clock" or "CUDA events".
  virtual const char* clock() const = 0;
};

/// The timer for a rank on `device`: CUDA events on a CUDA device (its current stream), the host clock
/// elsewhere.
std::unique_ptr<ComputeTimer> make_compute_timer(const c10::Device& device);

/// The samples and micro-batches of one update on one rank: updates with the same shape cost the same
/// to the balancer's cost model.
struct UpdateShape {
  int64_t samples = 0;
  int64_t micro_batches = 0;
  bool operator==(const UpdateShape& other) const {
    return samples == other.samples && micro_batches == other.micro_batches;
  }
};

/// One compute time per update from a ComputeTimer, without a host-device synchronisation of its own on
/// CUDA: it keeps two timers and answers with the previous update's interval, which the device has
/// finished by then, when that update had the same shape. See Note [Compute timing].
class UpdateComputeClock {
 public:
  using Factory = std::function<std::unique_ptr<ComputeTimer>()>;
  explicit UpdateComputeClock(const Factory& make);

  /// Before the update's compute is issued.
  void start();
  /// After the update's compute is issued and its own reads of device values are done: the seconds of
  /// compute of an update of shape `shape`. This update's when its timer is ready (the host clock
  /// always is); else the previous update's when it had the same shape; else this update's, waiting for
  /// the device (the first update, a changed split, a short last update of an epoch).
  double stop(UpdateShape shape);
  /// How many stop() calls waited for the device.
  int64_t waits() const { return waits_; }
  const char* clock() const { return timers_[0]->clock(); }

 private:
  std::array<std::unique_ptr<ComputeTimer>, 2> timers_;  // [update parity]
  std::array<UpdateShape, 2> shapes_;                    // [update parity] shape of the interval timed
  std::array<bool, 2> timed_{false, false};              // [update parity] holds a finished interval
  size_t current_ = 0;
  int64_t waits_ = 0;
};

}  // namespace hetseq
