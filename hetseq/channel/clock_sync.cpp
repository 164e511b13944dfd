#include "hetseq/channel/clock_sync.h"

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

namespace {

// Waits for a collective of the clock alignment; a failure names the rank and what was going on.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, int64_t rank, int64_t world) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw PeerError(fmt::format("rank {} of {}: aligning the ranks' clocks for --trace-dir failed: {} (a peer died "
                                 "or does not trace: every rank needs --trace-dir, or none)",
                                 rank, world, e.what()));
  }
}

}  // namespace

ClockAlignment align_clocks(c10d::ProcessGroup& group, c10::Device device, int rounds) {
  using Clock = std::chrono::steady_clock;
  const int64_t rank = group.getRank(), world = group.getSize();
  ClockAlignment out;
  std::vector<torch::Tensor> one{torch::zeros({1}, torch::TensorOptions().device(device))};
  // The first rounds warm the connections up; the last one's return is the common instant. A rank
  // leaves an allreduce at most one round trip after another, so that trip bounds the misalignment.
  Clock::time_point before;
  for (int i = 0; i < rounds; ++i) {
    before = Clock::now();
    wait_for(group.allreduce(one), rank, world);
    if (device.is_cuda()) one[0].cpu();  // the collective done on the device, not just enqueued
  }
  out.zero = Clock::now();
  out.system_us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  out.spread_us = std::chrono::duration_cast<std::chrono::microseconds>(out.zero - before).count();
  // Microseconds since 1970 (about 1.8e15) are exact in a double (below 2^53).
  torch::Tensor clocks = torch::zeros({world}, torch::TensorOptions().dtype(torch::kFloat64));
  clocks[rank] = static_cast<double>(out.system_us);
  std::vector<torch::Tensor> all{clocks.to(device)};
  wait_for(group.allreduce(all), rank, world);
  const torch::Tensor summed = all[0].cpu();
  const auto a = summed.accessor<double, 1>();
  for (int64_t r = 0; r < world; ++r) out.offsets_us.push_back(static_cast<int64_t>(a[r] - a[0]));
  return out;
}

}  // namespace hetseq
