#pragma once

#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

#include "hetseq/optim/optimizer.h"

namespace hetseq::optim {

/// Options of Adadelta, named after HetSeq's flags: `--lr`, `--adadelta_rho`, `--adadelta_eps`,
/// `--adadelta_weight_decay`.
struct AdadeltaOptions {
  double lr = 1.0;
  double rho = 0.9;
  double eps = 1e-6;
  /// L2 penalty added to the gradient: g += weight_decay * p.
  double weight_decay = 0;
};

/// HetSeq's Adadelta, the same update as torch.optim.Adadelta. Per parameter p with gradient g:
///   g += weight_decay * p   (when weight_decay != 0)
///   sq = rho*sq + (1-rho)*g*g;  std = sqrt(sq + eps);  delta = sqrt(acc + eps) / std * g
///   p -= lr * delta;  acc = rho*acc + (1-rho)*delta*delta
/// Buffers: "square_avg" (sq) and "acc_delta" (acc). One kernel call per operation and group of
/// parameters, see Note [Update groups].
class Adadelta : public Optimizer {
 public:
  /// Throws hetseq::UsageError naming the flag (`--lr`, `--adadelta_rho`, `--adadelta_eps`,
  /// `--adadelta_weight_decay`) when an option is out of range.
  Adadelta(std::vector<torch::Tensor> params, const AdadeltaOptions& options);

  std::string name() const override { return "adadelta"; }
  void step() override;
  std::map<std::string, double> hyperparameters() const override;
  void set_hyperparameter(const std::string& name, double value) override;
  const AdadeltaOptions& options() const { return options_; }

 protected:
  std::vector<std::string> buffer_names() const override { return {"square_avg", "acc_delta"}; }

 private:
  AdadeltaOptions options_;
};

}  // namespace hetseq::optim
