#pragma once
/// What a run's --zero-sharding choice asks of the session that builds it: the session asks this object,
/// made once from the choice and the world, instead of testing the choice itself.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "hetseq/reduce/ddp_options.h"
#include "hetseq/shard/zero_sharding.h"

namespace hetseq {

/// --zero-sharding as the session sees it, for a world of one rank or more: with one rank nothing is cut
/// (make_sharding_strategy says so), so every answer below but check_options() is "no" there. The sharding
/// itself is the ShardingStrategy (make_sharding_strategy). See Note [Sharded optimizer state], Note [Sharded
/// gradients] and Note [Sharded parameters].
class ShardingPolicy {
 public:
  /// `mode`: --zero-sharding; `distributed`: whether the world has more than one rank (World::distributed).
  ShardingPolicy(ZeroSharding mode, bool distributed) : mode_(mode), distributed_(distributed) {}

  /// The --zero-sharding choice, for messages and for make_sharding_strategy.
  ZeroSharding mode() const { return mode_; }
  /// Whether every rank steps its own shard of the optimizer state (`os`, `os+grad`, `full` over more than one
  /// rank): every rank takes part in every update (none may sit out), and a rank without --memory-budget
  /// offers its free memory to the shard plan.
  bool steps_shards() const { return distributed_ && shards_state(mode_); }
  /// Whether each bucket of gradients is summed to the rank that owns it (`os+grad`, `full` over more than one
  /// rank): the sharding strategy builds its own ShardReducer instead of the session's DistributedReducer.
  bool sums_gradients_to_owners() const { return distributed_ && shards_gradients(mode_); }
  /// Whether each rank keeps only its shard of the parameters and gathers units around their passes (`full`
  /// over more than one rank): the session hands the strategy the model's units, and the model is whole only
  /// until it is sharded.
  bool gathers_parameters() const { return distributed_ && shards_parameters(mode_); }
  /// The sharding that the memory estimate counts (MemoryFitOptions::sharding): the choice, or `none` for one
  /// rank.
  ZeroSharding counted_in_memory() const { return distributed_ ? mode_ : ZeroSharding::kNone; }

  /// Throws hetseq::UsageError naming the flags of a combination that `mode` cannot honour, with one rank or
  /// more: under `os+grad` and `full` a comm hook, --find-unused-parameters or --shared-memory-reduce on
  /// (they belong to the allreduce reducer). Called once, where the options come in
  /// (DistributedOptions::validate), before the world exists.
  static void check_options(ZeroSharding mode, const DdpOptions& ddp);
  /// Throws hetseq::UsageError naming task `task` where sums_gradients_to_owners() and one of `params` takes
  /// no gradient (every parameter's gradient accumulator is hooked).
  void check_parameters(const std::vector<at::Tensor>& params, const std::string& task) const;

 private:
  ZeroSharding mode_;
  bool distributed_;
};

}  // namespace hetseq
