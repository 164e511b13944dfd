#include "hetseq/task/task.h"

#include <torch/autograd.h>

namespace hetseq {

StepOutput Task::train_step(torch::nn::Module& model, const Batch& batch, const Backward& backward) {
  StepOutput out = compute_loss(model, batch);
  if (backward) {
    backward(out);
  } else {
    out.loss.backward();
  }
  return out;
}

StepOutput Task::valid_step(torch::nn::Module& model, const Batch& batch) {
  torch::NoGradGuard no_grad;
  return compute_loss(model, batch);
}

std::map<std::string, double> Task::derived_metrics(const LogSums& /*sums*/) const { return {}; }

}  // namespace hetseq
