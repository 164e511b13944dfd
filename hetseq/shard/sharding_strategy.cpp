#include "hetseq/shard/sharding_strategy.h"

namespace hetseq {

std::vector<torch::Tensor> ShardingStrategy::gradients() {
  std::vector<torch::Tensor> grads;
  for (const auto& p : optimizer().params()) {
    if (p.grad().defined()) grads.push_back(p.grad());  // none: unused on every rank (--find-unused-parameters)
  }
  return grads;
}

}  // namespace hetseq
