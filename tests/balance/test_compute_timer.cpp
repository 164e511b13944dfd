// The compute timing the balancer's cost model reads (hetseq/observe/compute_timer.h, Note [Compute timing]):
// the host clock on a CPU rank, and the pairing of each update with an interval of the same shape that lets a
// CUDA rank read its events without waiting for the device. The CUDA event timer itself is tested where a GPU
// is (tests/cuda/test_cuda_compute_timer.cpp); here a timer that lags like a device stands in for it.
#include <catch2/catch.hpp>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hetseq/observe/compute_timer.h"

using namespace hetseq;

namespace {

using Clock = std::chrono::steady_clock;

// Spins (no sleep, so that the host clock sees a busy rank) for `seconds`.
void busy_wait(double seconds) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  volatile int64_t spins = 0;
  while (Clock::now() < until) spins = spins + 1;
}

// A device that runs the intervals of LaggingTimers in order: an interval is done once the host has "read a
// value" computed after it (done_through), or when a timer waits for it.
struct FakeDevice {
  int64_t issued = 0;        // intervals started
  int64_t done_through = 0;  // intervals finished, in order
  std::map<int64_t, double> seconds;  // [interval] its length on the device
};

// A ComputeTimer whose intervals finish later than the host stops them, as CUDA events do.
class LaggingTimer final : public ComputeTimer {
 public:
  explicit LaggingTimer(FakeDevice& device) : device_(device) {}
  void start() override { id_ = ++device_.issued; }
  void stop() override {}
  bool ready() const override { return device_.done_through >= id_; }
  double seconds() override {
    if (!ready()) device_.done_through = id_;  // the host waits for the device
    return device_.seconds.at(id_);
  }
  const char* clock() const override { return "lagging"; }

 private:
  FakeDevice& device_;
  int64_t id_ = 0;
};

}  // namespace

TEST_CASE("The host compute timer measures a busy wait, and a CPU device gets it", "[balance][timing]") {
  std::unique_ptr<ComputeTimer> timer = make_compute_timer(torch::kCPU);
  CHECK(std::string(timer->clock()) == "host clock");
  for (const double want : {0.05, 0.02}) {
    CAPTURE(want);
    timer->start();
    busy_wait(want);
    timer->stop();
    CHECK(timer->ready());
    const double got = timer->seconds();
    CHECK(got >= want);
    CHECK(got < want + 0.02);  // the clock reads around the wait, on a machine that other processes share
  }
}

TEST_CASE("Update compute clock: on the host clock every update reports its own interval, without waiting",
          "[balance][timing]") {
  UpdateComputeClock clock([] { return make_compute_timer(torch::kCPU); });
  CHECK(std::string(clock.clock()) == "host clock");
  for (const double want : {0.03, 0.01, 0.03}) {
    CAPTURE(want);
    clock.start();
    busy_wait(want);
    const double got = clock.stop({8, 1});  // the same shape each time: still this update's own interval
    CHECK(got >= want);
    CHECK(got < want + 0.02);
  }
  CHECK(clock.waits() == 0);
}

TEST_CASE("Update compute clock: a device timer reports the previous update of the same shape and waits only "
          "when the shape changes",
          "[balance][timing]") {
  FakeDevice device;
  for (int64_t i = 1; i <= 7; ++i) device.seconds[i] = 0.1 * static_cast<double>(i);
  UpdateComputeClock clock([&] { return std::make_unique<LaggingTimer>(device); });
  // [update] its shape, and the interval whose seconds it must report.
  const std::vector<UpdateShape> shapes{{32, 1}, {32, 1}, {32, 1}, {48, 2}, {48, 2}, {32, 1}, {32, 1}};
  const std::vector<int64_t> reported{1, 1, 2, 4, 4, 6, 6};
  const std::vector<int64_t> waits{1, 1, 1, 2, 2, 3, 3};  // after each update
  for (size_t u = 0; u < shapes.size(); ++u) {
    CAPTURE(u);
    clock.start();
    // The update's own read of a device value (the statistics, the gradient norm) comes after the previous
    // update's work: that interval is done now, this one is not.
    device.done_through = std::max(device.done_through, device.issued - 1);
    CHECK(clock.stop(shapes[u]) == device.seconds.at(reported[u]));
    CHECK(clock.waits() == waits[u]);
  }
}
