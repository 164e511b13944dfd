#include "hetseq/task/task.h"

#include <torch/autograd.h>

namespace hetseq {

StepOutput Task::train_step(torch::nn::Module& model, const Batch& batch, const BeforeBackward& before_backward) {
  StepOutput out = compute_loss(model, batch);
  if (before_backward) before_backward(out.loss);
  out.loss.backward();
  return out;
}

StepOutput Task::valid_step(torch::nn::Module& model, const Batch& batch) {
  torch::NoGradGuard no_grad;
  return compute_loss(model, batch);
}

std::map<std::string, double> Task::derived_metrics(const LogSums& /*sums*/) const { return {}; }

}  // namespace hetseq
