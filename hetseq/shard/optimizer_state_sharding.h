#pragma once

#include <memory>

#include "hetseq/shard/sharded_optimizer.h"
#include "hetseq/shard/sharding_strategy.h"

namespace hetseq {

/// --zero-sharding os: the reducer's allreduce as without sharding, then each rank steps its shard of the
/// parameters with the optimizer state of that shard alone, and the shards are gathered to every rank
/// (ShardedOptimizer); a checkpoint keeps each rank's state in its own shard file. See Note [Sharded
/// optimizer state].
class OptimizerStateSharding final : public ShardingStrategy {
 public:
  OptimizerStateSharding(std::unique_ptr<ShardedOptimizer> optimizer, std::shared_ptr<GradientReducer> reducer);

  ZeroSharding mode() const override { return ZeroSharding::kOptimizerState; }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  GradientReducer& reducer() override { return *reducer_; }
  void reduce() override { reducer_->finish_update(); }
  void step() override { optimizer_->step_shard(); }
  void gather() override { optimizer_->gather(); }
  std::optional<optim::StatePiece> state_piece() const override { return optimizer_->state_piece(); }
  void load_state(const std::map<std::string, torch::Tensor>& scalars, const optim::StateSource& pieces) override {
    optimizer_->load_state(scalars, pieces);
  }

 private:
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::shared_ptr<GradientReducer> reducer_;
};

}  // namespace hetseq
