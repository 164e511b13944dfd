#include "hetseq/optim/adadelta.h"

#include <cmath>
#include <utility>

#include "hetseq/core/format.h"
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/optim/registry.h"
#include "hetseq/core/parse.h"

namespace hetseq::optim {

namespace {

const AdadeltaOptions& validated(const AdadeltaOptions& o) {
  if (!std::isfinite(o.lr) || o.lr < 0) {
    throw UsageError(fmt::format("--lr: the learning rate must be a finite number >= 0, got {}", o.lr));
  }
  if (!(o.rho >= 0 && o.rho <= 1)) {
    throw UsageError(fmt::format("--adadelta_rho: must be in [0, 1], got {}", o.rho));
  }
  if (!std::isfinite(o.eps) || o.eps < 0) {
    throw UsageError(fmt::format("--adadelta_eps: must be a finite number >= 0, got {}", o.eps));
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) {
    throw UsageError(fmt::format("--adadelta_weight_decay: must be a finite number >= 0, got {}", o.weight_decay));
  }
  return o;
}

}  // namespace

Adadelta::Adadelta(std::vector<torch::Tensor> params, const AdadeltaOptions& options)
    : Optimizer(std::move(params), validated(options).lr), options_(options) {}

void Adadelta::step() {
  apply_update([this](size_t i, torch::Tensor& p, const torch::Tensor& grad) {
    const double rho = options_.rho;
    const double eps = options_.eps;
    torch::Tensor& square_avg = buffer(i, "square_avg", p);
    torch::Tensor& acc_delta = buffer(i, "acc_delta", p);

    const torch::Tensor g = options_.weight_decay != 0 ? grad.add(p, options_.weight_decay) : grad;
    square_avg.mul_(rho).addcmul_(g, g, 1 - rho);
    const torch::Tensor std = square_avg.add(eps).sqrt_();
    const torch::Tensor delta = acc_delta.add(eps).sqrt_().div_(std).mul_(g);
    p.add_(delta, -lr());
    acc_delta.mul_(rho).addcmul_(delta, delta, 1 - rho);
  });
}

std::map<std::string, double> Adadelta::hyperparameters() const {
  return {{"rho", options_.rho}, {"eps", options_.eps}, {"weight_decay", options_.weight_decay}};
}

void Adadelta::set_hyperparameter(const std::string& name, double value) {
  AdadeltaOptions changed = options_;
  if (name == "rho") {
    changed.rho = value;
  } else if (name == "eps") {
    changed.eps = value;
  } else if (name == "weight_decay") {
    changed.weight_decay = value;
  } else {
    throw UsageError(fmt::format("adadelta has no hyper-parameter '{}'; it has rho, eps, weight_decay", name));
  }
  options_ = validated(changed);
}

OptimizerSpec adadelta_spec() {
  OptimizerSpec spec;
  spec.name = "adadelta";
  spec.flags = [](FlagSet& flags) {
    flags.add("adadelta_rho", "rho of Adadelta", "0.9", "RHO")
        .add("adadelta_eps", "epsilon of Adadelta", "1e-6", "EPS")
        .add("adadelta_weight_decay", "L2 weight decay of Adadelta", "0", "WD");
  };
  spec.configure = [](const FlagValues& args, const CommonOptimFlags& common) -> OptimizerFactory {
    AdadeltaOptions o;
    o.lr = common.lrs.front();
    o.rho = args.number("adadelta_rho");
    o.eps = args.number("adadelta_eps");
    o.weight_decay = args.number("adadelta_weight_decay");
    return [o](std::vector<torch::Tensor> params) { return std::make_unique<Adadelta>(std::move(params), o); };
  };
  return spec;
}

}  // namespace hetseq::optim
