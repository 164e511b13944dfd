// The CUDA event timer behind the balancer's compute timing (Note [Compute timing]): it times kernels, not their
// launches, and UpdateComputeClock reads it without waiting for the device once updates repeat their shape.
// Skipped, visibly, where no CUDA device is (see cuda/cuda_skip.h); tests/balance/test_compute_timer.cpp checks
// the host clock and the pairing with a stand-in device.
#include <chrono>
#include <cmath>
#include <memory>
#include <string>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "cuda/cuda_skip.h"
#include "hetseq/observe/compute_timer.h"

using namespace hetseq;
using namespace hetseq::test;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// About 2.7 TFLOP of float32 matrix products on the current stream: tens of milliseconds on any GPU, a few
// microseconds to launch each.
torch::Tensor heavy(const torch::Tensor& a) {
  torch::Tensor x = a;
  for (int i = 0; i < 20; ++i) x = torch::matmul(x, a).div_(64.0);  // keeps the entries near unit scale
  return x;
}

}  // namespace

TEST_CASE("CUDA: the compute timer of a CUDA device times its kernels, not their launches", "[cuda][timing]") {
  if (!cuda_or_skip()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  std::unique_ptr<ComputeTimer> timer = make_compute_timer(gpu);
  CHECK(std::string(timer->clock()) == "CUDA events");
  const torch::Tensor a = torch::randn({4096, 4096}, torch::TensorOptions().device(gpu));
  heavy(a);  // warm-up: cuBLAS handles and workspaces
  torch::cuda::synchronize();
  const auto t0 = Clock::now();
  timer->start();
  const torch::Tensor x = heavy(a);
  timer->stop();
  const double issued_s = since(t0);
  const bool ready_at_once = timer->ready();
  torch::cuda::synchronize();
  const double total_s = since(t0);
  CHECK(timer->ready());
  const double s = timer->seconds();
  INFO("launch " << issued_s << " s, events " << s << " s, host with a sync " << total_s << " s");
  CHECK_FALSE(ready_at_once);  // the host got there long before the device
  CHECK(s > 5 * issued_s);
  CHECK(s <= total_s);
  CHECK(s > 0.5 * total_s);
  CHECK(std::isfinite(x.sum().item<double>()));
}

TEST_CASE("CUDA: one compute time per update, with a wait only for the first of a shape", "[cuda][timing]") {
  if (!cuda_or_skip()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  UpdateComputeClock clock([gpu] { return make_compute_timer(gpu); });
  const torch::Tensor a = torch::randn({4096, 4096}, torch::TensorOptions().device(gpu));
  heavy(a);
  torch::cuda::synchronize();
  for (int update = 1; update <= 5; ++update) {
    CAPTURE(update);
    clock.start();
    // As an update does: work, one read of a device value (the gradient norm), then more work (the step).
    const double norm = heavy(a).norm().item<double>();
    heavy(a);
    const double s = clock.stop({32, 1});
    CHECK(std::isfinite(norm));
    CHECK(s > 0);
    CHECK(clock.waits() == 1);  // the first update waited for its own events; the others read the previous one's
  }
}
