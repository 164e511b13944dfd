#pragma once
/// The ShardingStrategy for a --zero-sharding choice.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "hetseq/reduce/gradient_reducer.h"
#include "hetseq/optim/registry.h"
#include "hetseq/shard/sharding_strategy.h"
#include "hetseq/shard/zero_sharding.h"
#include "hetseq/task/model_units.h"

namespace hetseq {

/// What make_sharding_strategy needs besides the optimizer's factory and the reducer.
struct ShardingOptions {
  ZeroSharding mode = ZeroSharding::kNone;  // --zero-sharding
  int64_t budget_bytes = 0;  // this rank's --memory-budget, or its free memory (the shard plan's share)
  bool json = false;         // --log-format json: the plan's `shard` lines on stdout too
  int64_t bucket_bytes = 25 << 20;   // os+grad: the largest gradient bucket (--bucket-cap-mb)
  std::vector<torch::Tensor> buffers;  // os+grad, full: the model's buffers, rank 0's before each forward
  /// full: [param] the unit of each parameter (ShardableModel::units()), or -1 for the root; empty: all root.
  std::vector<int64_t> unit_of;
  /// full: the units' gathers' own process group, with the ranks of `group` (World::role_group).
  c10::intrusive_ptr<c10d::ProcessGroup> unit_group;
  /// full: a Gloo group of the same ranks for the host's count of passes (World::host_group), where the shards
  /// are on a GPU; null: `group`, whose shards are then on the CPU, or a read of the device (Note [Stat sync]).
  c10::intrusive_ptr<c10d::ProcessGroup> host_group;
  /// full: what the model's units run through (ShardableModel::set_unit_runner), given the UnitGather built.
  std::function<void(std::shared_ptr<UnitRunner>)> set_unit_runner;
};

/// The strategy for `options.mode`: `make` builds the optimizer over `params` (or over this rank's shard
/// of them), `reducer` sums the gradients (under `os+grad` null: the strategy builds its ShardReducer),
/// `group` (null for one process) carries the shards. A collective under `os`, `os+grad` and `full` with more
/// than one rank (ShardedOptimizer::create); with one rank they have nothing to shard and say so. Throws
/// as ShardedOptimizer::create.
std::unique_ptr<ShardingStrategy> make_sharding_strategy(std::vector<torch::Tensor> params,
                                                         const optim::OptimizerFactory& make,
                                                         std::shared_ptr<GradientReducer> reducer,
                                                         c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                         const ShardingOptions& options);

}  // namespace hetseq
