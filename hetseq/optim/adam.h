#pragma once

#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

#include "hetseq/optim/optimizer.h"

namespace hetseq::optim {

/// Options of Adam, named after HetSeq's flags: `--lr`, `--adam-betas`, `--adam-eps`, `--weight-decay`.
struct AdamOptions {
  double lr = 0.001;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// Decoupled weight decay (AdamW style): p -= weight_decay * lr * p before the Adam update.
  double weight_decay = 0;
  /// Steps through LibTorch's fused AdamW kernel (one pass over each group's memory; within a few ulp of the
  /// formula below, see Note [Fused Adam]). false: through _foreach_* kernels, bit-equal on a CPU to the
  /// formula evaluated one operation at a time. Not a flag: library users and the benchmark choose.
  bool fused = true;
  /// Reads the step size, the weight decay's factor and epsilon from tensors on the parameters' device, filled
  /// before the kernels run, instead of passing them as host numbers into the kernels: the form a CUDA graph can
  /// replay with the values of each update (Note [Adam from device scalars]). Bit-equal on a CPU to fused = false.
  bool device_scalars = false;
};

/// HetSeq's (fairseq's) Adam with decoupled weight decay. Per parameter p with gradient g and its own
/// update count t (1-based, see Note [Optimizer state]):
///   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g;  denom = sqrt(v) + eps
///   step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
///   p -= weight_decay * lr * p   (when weight_decay != 0, on the current p)
///   p -= step_size * m / denom
/// Buffers: "exp_avg" (m) and "exp_avg_sq" (v). fp16/bf16 parameters are updated in fp32. One kernel call
/// per group of parameters, see Note [Update groups].
class Adam : public Optimizer {
 public:
  /// Throws hetseq::UsageError naming the flag (`--lr`, `--adam-betas`, `--adam-eps`, `--weight-decay`)
  /// when an option is out of range.
  Adam(std::vector<torch::Tensor> params, const AdamOptions& options);

  std::string name() const override { return "adam"; }
  void step() override;
  /// With AdamOptions::device_scalars: prepare_step() fills the scalars of each group, run_step() runs the
  /// kernels that read them (Note [The step in a CUDA graph]).
  bool splits_step() const override { return options_.device_scalars; }
  bool use_split_step() override {
    options_.device_scalars = true;
    return true;
  }
  void prepare_step() override;
  void run_step() override;
  std::vector<torch::Tensor> step_tensors() const override;
  std::map<std::string, double> hyperparameters() const override;
  void set_hyperparameter(const std::string& name, double value) override;
  const AdamOptions& options() const { return options_; }

 protected:
  std::vector<std::string> buffer_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  AdamOptions options_;
  std::vector<torch::Tensor> scalars_;  // device_scalars: [group * 3 + k] -step size, -decay factor, epsilon
};

}  // namespace hetseq::optim
