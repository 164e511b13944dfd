#pragma once
/// The ShardingStrategy for a --zero-sharding choice.

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "hetseq/reduce/gradient_reducer.h"
#include "hetseq/optim/registry.h"
#include "hetseq/shard/sharding_strategy.h"
#include "hetseq/shard/zero_sharding.h"

namespace hetseq {

/// What make_sharding_strategy needs besides the optimizer's factory and the reducer.
struct ShardingOptions {
  ZeroSharding mode = ZeroSharding::kNone;  // --zero-sharding
  int64_t budget_bytes = 0;  // this rank's --memory-budget, or its free memory (the shard plan's share)
  bool json = false;         // --log-format json: the plan's `shard` lines on stdout too
  int64_t bucket_bytes = 25 << 20;   // os+grad: the largest gradient bucket (--bucket-cap-mb)
  std::vector<torch::Tensor> buffers;  // os+grad: the model's buffers, rank 0's before each forward
};

/// The strategy for `options.mode`: `make` builds the optimizer over `params` (or over this rank's shard
/// of them), `reducer` sums the gradients (under `os+grad` null: the strategy builds its ShardReducer),
/// `group` (null for one process) carries the shards. A collective under `os` and `os+grad` with more
/// than one rank (ShardedOptimizer::create); with one rank they have nothing to shard and say so. Throws
/// as ShardedOptimizer::create.
std::unique_ptr<ShardingStrategy> make_sharding_strategy(std::vector<torch::Tensor> params,
                                                         const optim::OptimizerFactory& make,
                                                         std::shared_ptr<GradientReducer> reducer,
                                                         c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                         const ShardingOptions& options);

}  // namespace hetseq
