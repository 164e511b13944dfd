#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "hetseq/reduce/gradient_reducer.h"
#include "hetseq/shard/accumulator_hooks.h"
#include "hetseq/shard/shard_plan.h"

namespace hetseq {

/// The largest gradient bucket under os+grad for `total_bytes` of gradients over `world` ranks: --bucket-cap-mb
/// (`cap_bytes`), but at most a 1/(8 W) part of the gradients (and at least 64 KiB), so that the buckets a
/// rank holds besides its shard (one being copied, two in flight, with W copies each on their owner: at
/// most 2 W + 1) stay near a quarter of the whole gradients. Pure; the memory check uses it too.
int64_t shard_bucket_bytes(int64_t total_bytes, int64_t world, int64_t cap_bytes);

/// --zero-sharding os+grad's reducer: each rank ends an update holding only its shard of the summed
/// gradients (shard_gradient_views()), and the parameters' own gradients are freed as their buckets leave.
/// Buckets are cut at shard boundaries, so that each has one owner, and each is gathered to its owner
/// alone, which sums the ranks' copies in rank order into its shard's gradient buffer; every copy is freed
/// once summed. See Note [Sharded gradients].
class ShardReducer final : public GradientReducer {
 public:
  /// `params` (every parameter that takes a gradient, in the model's order), `plan` [rank] the shard plan
  /// over them (plan_shards), `buffers` the model's buffers (rank 0's before each forward), `bucket_bytes`
  /// the largest bucket (shard_bucket_bytes). Hooks every parameter's gradient accumulator; every rank builds it alike.
  ShardReducer(std::vector<torch::Tensor> params, std::vector<torch::Tensor> buffers, std::vector<ShardRange> plan,
               c10::intrusive_ptr<c10d::ProcessGroup> group, int64_t bucket_bytes);
  ~ShardReducer() override;
  ShardReducer(const ShardReducer&) = delete;
  ShardReducer& operator=(const ShardReducer&) = delete;

  void before_forward() override;
  void before_backward(int64_t index, int64_t count, const torch::Tensor& loss,
                       const SampleCount& samples = nullptr) override;
  /// Launches the buckets that no gradient completed (a parameter without one counts as zeros), waits for
  /// every reduction and frees every parameter's gradient: shard_gradient_views() then see the sums.
  void finish_update() override;
  ReductionTiming last_timing() const override { return timing_; }

  /// Views of this rank's shard of the flat gradient space (after finish_update(), the sums over the ranks)
  /// for `slices` (shard_slices of this rank's shard), as the optimizer's views.
  std::vector<torch::Tensor> shard_gradient_views(const std::vector<ShardSlice>& slices) const;
  /// The bucket layout: [bucket] its range of the flat space and its owner, in launch order.
  struct Bucket {
    int64_t first = 0;
    int64_t numel = 0;
    int64_t owner = 0;
  };

 private:
  struct InFlight {
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<torch::Tensor> input;                // [1] this rank's copy of the bucket
    std::vector<std::vector<torch::Tensor>> output;  // the owner's: [1][rank] every rank's copy
    size_t bucket = 0;
  };
  void on_gradient(size_t param);
  void launch_ready();
  void launch(size_t bucket);
  /// Waits for `f`'s gather; the owner sums the copies into its shard. Frees the copies.
  void finish(InFlight& f);

  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> buffers_;
  std::vector<ShardRange> plan_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  int64_t rank_ = 0;
  std::vector<int64_t> param_first_;  // [param] its first element in the flat space
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> bucket_params_;  // [bucket] the parameters it touches
  std::vector<std::vector<size_t>> param_buckets_;  // [param] the buckets it touches
  torch::Tensor shard_gradient_;
  AccumulatorHooks hooks_;  // on every parameter: on_gradient

  // The update in progress (the last micro-batch's backward).
  bool armed_ = false;
  std::vector<int64_t> waiting_;     // [bucket] its parameters whose gradient is not complete yet
  std::vector<int64_t> param_left_;  // [param] its buckets not launched yet
  size_t next_launch_ = 0;
  std::deque<InFlight> in_flight_;
  ReductionTiming timing_;
};

}  // namespace hetseq
