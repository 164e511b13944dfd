#include "hetseq/shard/sharding_strategy.h"

#include "hetseq/checkpoint/training_state.h"

namespace hetseq {

std::vector<torch::Tensor> ShardingStrategy::gradients() {
  std::vector<torch::Tensor> grads;
  for (const auto& p : optimizer().params()) {
    if (p.grad().defined()) grads.push_back(p.grad());  // none: unused on every rank (--find-unused-parameters)
  }
  return grads;
}

std::vector<std::pair<std::string, torch::Tensor>> ShardingStrategy::model_tensors(const torch::nn::Module& model) {
  return hetseq::model_tensors(model);
}

}  // namespace hetseq
