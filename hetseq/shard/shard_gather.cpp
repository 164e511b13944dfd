#include "hetseq/shard/shard_gather.h"

#include <algorithm>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/world/lost_peer.h"

namespace hetseq {

// Note [Gathering uneven shards]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// After the step each rank holds the new values of its own shard only; every rank needs them all for
// the next forward pass. The shards have unequal sizes (Note [Sharded optimizer state]), and Gloo's
// allgather wants equal ones. Two ways, both a copy into a flat buffer and out of it, since the
// shards are pieces of several parameters:
// - kAllgatherPadded: one allgather of buffers padded to the largest shard: one collective, but
//   W x max_numel elements travel to each rank where sum numel would do (with budgets 1:1:2, 4/3 of
//   the bytes).
// - kBroadcastPerRank: one broadcast per rank, from that rank, of its exact shard: no padding, W
//   collectives, one after another through one buffer of the largest shard's size (the padded
//   allgather keeps W + 1 such buffers). The buffer is memory that sharding adds to every rank: with
//   budgets 1:1:2 half of the parameters' size, where a buffer per rank would be all of it (Note
//   [Memory that a rank needs]).
// Both are plain c10d collectives on the parameters' device, so the same code serves Gloo and NCCL.
// On Gloo over loopback (3 CPU ranks, budgets 1:1:2, benchmarks/zero_gather.cpp) the broadcasts take
// 5 ms for MNIST's 1.2 M elements and 54 ms for 10 M, against 10 ms and 149 ms for the padded
// allgather (100 ms with equal budgets: Gloo's allgather is slower than its broadcast even unpadded),
// so broadcasts are the default. NCCL's allgather is a ring like its broadcast; it is not measured.

ShardGather::ShardGather(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<ShardRange> plan,
                         std::vector<torch::Tensor> params, GatherMethod method)
    : group_(std::move(group)), plan_(std::move(plan)), method_(method), rank_(group_->getRank()) {
  HETSEQ_ASSERT(static_cast<int64_t>(plan_.size()) == group_->getSize(), "shard plan of {} ranks for a group of {}",
                plan_.size(), group_->getSize());
  HETSEQ_ASSERT(!params.empty(), "ShardGather without parameters");
  std::vector<int64_t> numels;
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& p = params[i];
    HETSEQ_ASSERT(p.is_contiguous() && p.scalar_type() == params[0].scalar_type() && p.device() == params[0].device(),
                  "sharded parameter {} must be contiguous with parameter 0's dtype and device ({} {}), got {} {}", i,
                  c10::toString(params[0].scalar_type()), params[0].device().str(), c10::toString(p.scalar_type()),
                  p.device().str());
    flat_.push_back(p.detach().view({-1}));
    numels.push_back(p.numel());
    total += p.numel();
  }
  HETSEQ_ASSERT(plan_.back().first + plan_.back().numel == total, "shard plan covers {} elements, parameters have {}",
                plan_.back().first + plan_.back().numel, total);
  int64_t largest = 0;
  for (const ShardRange& r : plan_) {
    slices_.push_back(shard_slices(numels, r));
    largest = std::max(largest, r.numel);
  }
  const auto options = params[0].options();
  if (method_ == GatherMethod::kAllgatherPadded) {
    for (size_t r = 0; r < plan_.size(); ++r) buffers_.push_back(torch::empty({largest}, options));
    send_ = torch::empty({largest}, options);
  } else {
    buffers_.push_back(torch::empty({largest}, options));
  }
}

void ShardGather::pack(int64_t rank, torch::Tensor& into) const {
  int64_t at = 0;
  for (const ShardSlice& s : slices_[static_cast<size_t>(rank)]) {
    into.narrow(0, at, s.numel).copy_(flat_[s.param].narrow(0, s.offset, s.numel));
    at += s.numel;
  }
}

void ShardGather::unpack(int64_t rank, const torch::Tensor& from) {
  int64_t at = 0;
  for (const ShardSlice& s : slices_[static_cast<size_t>(rank)]) {
    flat_[s.param].narrow(0, s.offset, s.numel).copy_(from.narrow(0, at, s.numel));
    at += s.numel;
  }
}

void ShardGather::gather() {
  torch::NoGradGuard no_grad;
  const int64_t world = static_cast<int64_t>(plan_.size());
  if (world == 1) return;
  if (method_ == GatherMethod::kAllgatherPadded) {
    pack(rank_, send_);
    std::vector<torch::Tensor> input{send_};
    std::vector<std::vector<torch::Tensor>> output{buffers_};
    wait_for_peers(group_->allgather(output, input), rank_, world, "allgather of the parameters' shards after the update");
    for (int64_t r = 0; r < world; ++r) {
      if (r != rank_) unpack(r, output[0][static_cast<size_t>(r)]);
    }
    return;
  }
  for (int64_t r = 0; r < world; ++r) {
    torch::Tensor buffer = buffers_.front().narrow(0, 0, plan_[static_cast<size_t>(r)].numel);
    if (r == rank_) pack(rank_, buffer);
    std::vector<torch::Tensor> tensors{buffer};
    c10d::BroadcastOptions options;
    options.rootRank = r;
    wait_for_peers(group_->broadcast(tensors, options), rank_, world,
                   fmt::format("broadcast of rank {}'s shard of the parameters after the update", r));
    if (r != rank_) unpack(r, buffer);
  }
}

}  // namespace hetseq
