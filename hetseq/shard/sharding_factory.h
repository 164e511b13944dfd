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
};

/// The strategy for `options.mode`: `make` builds the optimizer over `params` (or over this rank's shard
/// of them), `reducer` sums the gradients, `group` (null for one process) carries the shards. A
/// collective under `os` with more than one rank (ShardedOptimizer::create); with one rank `os` has
/// nothing to shard and says so. Throws as ShardedOptimizer::create.
std::unique_ptr<ShardingStrategy> make_sharding_strategy(std::vector<torch::Tensor> params,
                                                         const optim::OptimizerFactory& make,
                                                         std::shared_ptr<GradientReducer> reducer,
                                                         c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                         const ShardingOptions& options);

}  // namespace hetseq
