#pragma once

#include <memory>
#include <vector>

#include "hetseq/shard/gradient_sharding.h"
#include "hetseq/shard/shard_reducer.h"
#include "hetseq/shard/sharded_optimizer.h"
#include "hetseq/shard/sharding_strategy.h"
#include "hetseq/shard/unit_gather.h"

namespace hetseq {

/// --zero-sharding full: os+grad's sharded gradients and optimizer state (ShardReducer, ShardedOptimizer),
/// and the parameters sharded too: each rank keeps its shard of them, which its optimizer steps in place,
/// and the model's units gather theirs around each pass (UnitGather); only the root's parameters are
/// gathered after the step. Checkpoints are those of `os`, with the whole model gathered unit by unit for
/// rank 0's file. See Note [Sharded parameters].
class ParameterSharding final : public ShardingStrategy {
 public:
  ParameterSharding(std::unique_ptr<ShardedOptimizer> optimizer, std::shared_ptr<ShardReducer> reducer,
                    std::shared_ptr<UnitGather> units, c10::intrusive_ptr<c10d::ProcessGroup> group);

  ZeroSharding mode() const override { return ZeroSharding::kFull; }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  GradientReducer& reducer() override { return *reducer_; }
  /// The reduction, then every unit a backward pass left gathered is freed.
  void reduce() override;
  void step() override { optimizer_->step_shard(); }
  /// The root's parameters (the units gather theirs in the next pass).
  void gather() override;
  std::vector<torch::Tensor> gradients() override { return gradients_; }
  torch::Tensor global_norm(const torch::Tensor& local) override { return global_norm_of_shards(group_, local); }
  bool needs_stand_ins() const override { return true; }
  int64_t passes(int64_t mine) override;
  void collect_model(bool keep) override;
  std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model) override;
  std::optional<optim::StatePiece> state_piece() const override { return optimizer_->state_piece(); }
  void load_state(const std::map<std::string, torch::Tensor>& scalars, const optim::StateSource& pieces) override {
    optimizer_->load_state(scalars, pieces);
  }

 private:
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::shared_ptr<ShardReducer> reducer_;
  std::shared_ptr<UnitGather> units_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<torch::Tensor> gradients_;  // [view] the reducer's shard gradient, as the optimizer's views
  std::vector<torch::Tensor> collected_;  // [param] collect_model()'s whole parameters, on the CPU
};

}  // namespace hetseq
