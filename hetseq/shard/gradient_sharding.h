#pragma once

#include <memory>
#include <vector>

#include "hetseq/shard/shard_reducer.h"
#include "hetseq/shard/sharded_optimizer.h"
#include "hetseq/shard/sharding_strategy.h"

namespace hetseq {

/// The global gradient norm from every rank's norm of its shard, `local` (float64, a scalar): sqrt(sum over
/// the ranks of local^2), one allreduce over `group` that every rank calls at the same point.
torch::Tensor global_norm_of_shards(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const torch::Tensor& local);

/// --zero-sharding os+grad: the ShardReducer sums each bucket of gradients to the rank whose shard holds
/// it, so each rank keeps its shard of the gradients and of the optimizer state; the Controller clips
/// with the global norm from the ranks' partial norms, each rank steps its shard (ShardedOptimizer, fed
/// the reducer's shard gradient) and the shards are gathered to every rank. Checkpoints are those of `os`.
/// See Note [Sharded gradients].
class GradientSharding : public ShardingStrategy {
 public:
  GradientSharding(std::unique_ptr<ShardedOptimizer> optimizer, std::shared_ptr<ShardReducer> reducer,
                   c10::intrusive_ptr<c10d::ProcessGroup> group);

  ZeroSharding mode() const override { return ZeroSharding::kGradients; }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  GradientReducer& reducer() override { return *reducer_; }
  void reduce() override { reducer_->finish_update(); }
  void step() override { optimizer_->step_shard(); }
  void gather() override { optimizer_->gather(); }
  std::vector<torch::Tensor> gradients() override { return gradients_; }
  torch::Tensor global_norm(const torch::Tensor& local) override { return global_norm_of_shards(group_, local); }
  std::optional<optim::StatePiece> state_piece() const override { return optimizer_->state_piece(); }
  void load_state(const std::map<std::string, torch::Tensor>& scalars, const optim::StateSource& pieces) override {
    optimizer_->load_state(scalars, pieces);
  }

 protected:
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::shared_ptr<ShardReducer> reducer_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<torch::Tensor> gradients_;  // [view] the reducer's shard gradient, as the optimizer's views
};

}  // namespace hetseq
