#include "hetseq/task/buffer_snapshot.h"

#include "hetseq/core/error.h"

namespace hetseq {

BufferSnapshot::BufferSnapshot(torch::nn::Module& model) : model_(model) {
  torch::NoGradGuard no_grad;
  for (const auto& b : model_.buffers()) copies_.push_back(b.defined() ? b.detach().clone() : b);
}

void BufferSnapshot::restore() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> live = model_.buffers();
  HETSEQ_ASSERT(live.size() == copies_.size(), "the model has {} buffers, {} when they were copied", live.size(),
                copies_.size());
  for (size_t i = 0; i < live.size(); ++i) {
    if (live[i].defined()) live[i].copy_(copies_[i]);
  }
}

}  // namespace hetseq
