#pragma once

#include <memory>

#include "hetseq/shard/sharding_strategy.h"

namespace hetseq {

/// --zero-sharding none: every rank holds and steps the whole model with the whole optimizer state, after
/// the reducer's allreduce; a checkpoint keeps the whole state in its file.
class NoSharding final : public ShardingStrategy {
 public:
  NoSharding(std::unique_ptr<optim::Optimizer> optimizer, std::shared_ptr<GradientReducer> reducer);

  ZeroSharding mode() const override { return ZeroSharding::kNone; }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  GradientReducer& reducer() override { return *reducer_; }
  void reduce() override { reducer_->finish_update(); }
  void step() override { optimizer_->step(); }
  void gather() override {}
  std::optional<optim::StatePiece> state_piece() const override { return std::nullopt; }
  /// Reads the whole range (a checkpoint that `os` wrote, resumed without sharding) into the optimizer.
  void load_state(const std::map<std::string, torch::Tensor>& scalars, const optim::StateSource& pieces) override;

 private:
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<GradientReducer> reducer_;
};

}  // namespace hetseq
