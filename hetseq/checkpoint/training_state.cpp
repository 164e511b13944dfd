#include "hetseq/checkpoint/training_state.h"

namespace hetseq {

torch::Tensor cpu_copy(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), cpu_copy(item.value()));
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    out.emplace_back(item.key(), cpu_copy(item.value()));
  }
  return out;
}

}  // namespace hetseq
