#pragma once

#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

#include "hetseq/optim/optimizer.h"

namespace hetseq::optim {

/// Options of SGD, named after the flags `--lr`, `--momentum`, `--weight-decay`.
struct SgdOptions {
  double lr = 0;  ///< `--lr` (required in practice: 0 leaves the parameters unchanged)
  double momentum = 0;
  /// L2 penalty added to the gradient: g += weight_decay * p.
  double weight_decay = 0;
};

/// Stochastic gradient descent with momentum, the same update as torch.optim.SGD (no dampening, no
/// Nesterov). Per parameter p with gradient g:
///   g += weight_decay * p            (when weight_decay != 0)
///   buf = g at the first update, then buf = momentum*buf + g; g = buf   (when momentum != 0)
///   p -= lr * g
/// Buffer: "momentum_buffer" (only when momentum != 0). One kernel call per operation and group of
/// parameters, see Note [Update groups].
class Sgd : public Optimizer {
 public:
  /// Throws hetseq::UsageError naming the flag (`--lr`, `--momentum`, `--weight-decay`) when an option
  /// is out of range.
  Sgd(std::vector<torch::Tensor> params, const SgdOptions& options);

  std::string name() const override { return "sgd"; }
  void step() override;
  std::map<std::string, double> hyperparameters() const override;
  void set_hyperparameter(const std::string& name, double value) override;
  const SgdOptions& options() const { return options_; }

 protected:
  std::vector<std::string> buffer_names() const override;

 private:
  SgdOptions options_;
};

}  // namespace hetseq::optim
