#include "hetseq/observe/compute_timer.h"

#include <chrono>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "hetseq/core/error.h"

namespace hetseq {

// Note [Compute timing]
// ~~~~~~~~~~~~~~~~~~~~~
// The balancer fits each rank's seconds per update against its samples (Note [Balancing]), so each
// update's compute must be timed as the device ran it. On a CPU rank the host runs the work, and the
// steady clock around the update is the measure. On a CUDA rank the host only issues kernels: a host
// clock measures launches, plus whatever waits the update's own reads of device values happen to make.
// There the interval is a pair of CUDA events recorded on the compute stream around the update (timing
// events, read with elapsedTime).
//
// Reading an event pair needs the device to have reached the stop event. The update's last operation
// (the optimizer step) runs after its last read of a device value (the gradient norm), so at the end
// of update N its stop event is usually still ahead of the device, and waiting for it would be a
// host-device synchronisation that the update does not need. But update N's reads come after update
// N-1's kernels on the same stream, so by then update N-1's events are done. UpdateComputeClock keeps
// two timers (one per update parity) and reports for update N the compute of update N-1 when the two
// had the same shape (samples and micro-batches): the same cost to the balancer's model, at no wait.
// Only when the shape changed (the first update, a new split, the short last update of an epoch) does
// it wait for update N's own stop event: a few waits per epoch, counted by waits(). On the host clock
// every interval is ready at once, and each update reports its own.

namespace {

using Clock = std::chrono::steady_clock;

class HostComputeTimer final : public ComputeTimer {
 public:
  void start() override { start_ = Clock::now(); }
  void stop() override { stop_ = Clock::now(); }
  bool ready() const override { return true; }
  double seconds() override { return std::chrono::duration<double>(stop_ - start_).count(); }
  const char* clock() const override { return "host clock"; }

 private:
  Clock::time_point start_, stop_;
};

class CudaEventComputeTimer final : public ComputeTimer {
 public:
  explicit CudaEventComputeTimer(const c10::Device& device)
      : impl_(device.type()),
        device_(device.has_index() ? device : impl_.getDevice()),
        start_(device.type(), c10::EventFlag::BACKEND_DEFAULT),
        stop_(device.type(), c10::EventFlag::BACKEND_DEFAULT) {}
  void start() override {
    start_.record(impl_.getStream(device_));
    stopped_ = false;
  }
  void stop() override {
    stop_.record(impl_.getStream(device_));
    stopped_ = true;
  }
  bool ready() const override { return stopped_ && stop_.query(); }
  double seconds() override {
    HETSEQ_ASSERT(stopped_, "CUDA compute timer read before stop()");
    // elapsedTime needs both events done; each wait returns at once when the device is past it.
    start_.synchronize();
    stop_.synchronize();
    return start_.elapsedTime(stop_) / 1e3;
  }
  const char* clock() const override { return "CUDA events"; }

 private:
  c10::impl::VirtualGuardImpl impl_;
  c10::Device device_;
  c10::Event start_, stop_;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<ComputeTimer> make_compute_timer(const c10::Device& device) {
  if (device.is_cuda()) return std::make_unique<CudaEventComputeTimer>(device);
  return std::make_unique<HostComputeTimer>();
}

UpdateComputeClock::UpdateComputeClock(const Factory& make) : timers_{make(), make()} {
  HETSEQ_ASSERT(timers_[0] && timers_[1], "UpdateComputeClock built with a factory that returned no timer");
}

void UpdateComputeClock::start() {
  current_ = 1 - current_;
  timed_[current_] = false;
  timers_[current_]->start();
}

double UpdateComputeClock::stop(UpdateShape shape) {
  ComputeTimer& now = *timers_[current_];
  now.stop();
  shapes_[current_] = shape;
  timed_[current_] = true;
  if (now.ready()) return now.seconds();
  const size_t before = 1 - current_;
  if (timed_[before] && shapes_[before] == shape) {
    if (!timers_[before]->ready()) ++waits_;
    return timers_[before]->seconds();
  }
  ++waits_;
  return now.seconds();
}

}  // namespace hetseq
