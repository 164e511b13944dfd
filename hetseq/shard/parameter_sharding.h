#pragma once

#include <memory>
#include <vector>

#include "hetseq/shard/gradient_sharding.h"
#include "hetseq/shard/unit_gather.h"

namespace hetseq {

/// --zero-sharding full: os+grad's sharded gradients and optimizer state (ShardReducer, ShardedOptimizer),
/// and the parameters sharded too: each rank keeps its shard of them, which its optimizer steps in place,
/// and the model's units gather theirs around each pass (UnitGather); only the root's parameters are
/// gathered after the step. Checkpoints are those of `os`, with the whole model gathered unit by unit for
/// rank 0's file. See Note [Sharded parameters].
class ParameterSharding final : public GradientSharding {
 public:
  /// `host_group`: where the count of passes goes in host memory (see ShardingOptions::host_group).
  ParameterSharding(std::unique_ptr<ShardedOptimizer> optimizer, std::shared_ptr<ShardReducer> reducer,
                    std::shared_ptr<UnitGather> units, c10::intrusive_ptr<c10d::ProcessGroup> group,
                    c10::intrusive_ptr<c10d::ProcessGroup> host_group = nullptr);

  ZeroSharding mode() const override { return ZeroSharding::kFull; }
  /// The reduction, then every unit a backward pass left gathered is freed.
  void reduce() override;
  /// The root's parameters (the units gather theirs in the next pass).
  void gather() override;
  bool needs_stand_ins() const override { return true; }
  int64_t passes(int64_t mine) override;
  void collect_model(bool keep) override;
  void collect_model_digests() override;
  std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model) override;

 private:
  std::shared_ptr<UnitGather> units_;
  c10::intrusive_ptr<c10d::ProcessGroup> host_group_;
  std::vector<torch::Tensor> collected_;  // [param] collect_model()'s whole parameters, on the CPU
};

}  // namespace hetseq
