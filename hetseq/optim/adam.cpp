#include "hetseq/optim/adam.h"

#include <cmath>
#include <utility>

#include "hetseq/core/format.h"
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/optim/registry.h"
#include "hetseq/core/parse.h"

namespace hetseq::optim {

namespace {

const AdamOptions& validated(const AdamOptions& o) {
  if (!std::isfinite(o.lr) || o.lr < 0) {
    throw UsageError(fmt::format("--lr: the learning rate must be a finite number >= 0, got {}", o.lr));
  }
  for (double beta : {o.beta1, o.beta2}) {
    if (!(beta >= 0 && beta < 1)) {
      throw UsageError(fmt::format("--adam-betas: each beta must be in [0, 1), got ({}, {})", o.beta1, o.beta2));
    }
  }
  if (!std::isfinite(o.eps) || o.eps < 0) {
    throw UsageError(fmt::format("--adam-eps: epsilon must be a finite number >= 0, got {}", o.eps));
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) {
    throw UsageError(fmt::format("--weight-decay: must be a finite number >= 0, got {}", o.weight_decay));
  }
  return o;
}

}  // namespace

Adam::Adam(std::vector<torch::Tensor> params, const AdamOptions& options)
    : Optimizer(std::move(params), validated(options).lr), options_(options) {}

void Adam::step() {
  apply_update([this](size_t i, torch::Tensor& p, const torch::Tensor& g) {
    const double beta1 = options_.beta1;
    const double beta2 = options_.beta2;
    torch::Tensor& exp_avg = buffer(i, "exp_avg", p);
    torch::Tensor& exp_avg_sq = buffer(i, "exp_avg_sq", p);

    exp_avg.mul_(beta1).add_(g, 1 - beta1);
    exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2);
    const torch::Tensor denom = exp_avg_sq.sqrt().add_(options_.eps);

    const auto t = static_cast<double>(param_step(i));
    const double bias_correction1 = 1 - std::pow(beta1, t);
    const double bias_correction2 = 1 - std::pow(beta2, t);
    const double step_size = lr() * std::sqrt(bias_correction2) / bias_correction1;

    if (options_.weight_decay != 0) p.add_(p, -options_.weight_decay * lr());
    p.addcdiv_(exp_avg, denom, -step_size);
  });
}

std::map<std::string, double> Adam::hyperparameters() const {
  return {{"beta1", options_.beta1}, {"beta2", options_.beta2}, {"eps", options_.eps}, {"weight_decay", options_.weight_decay}};
}

void Adam::set_hyperparameter(const std::string& name, double value) {
  AdamOptions changed = options_;
  if (name == "beta1") {
    changed.beta1 = value;
  } else if (name == "beta2") {
    changed.beta2 = value;
  } else if (name == "eps") {
    changed.eps = value;
  } else if (name == "weight_decay") {
    changed.weight_decay = value;
  } else {
    throw UsageError(fmt::format("adam has no hyper-parameter '{}'; it has beta1, beta2, eps, weight_decay", name));
  }
  options_ = validated(changed);
}

OptimizerSpec adam_spec() {
  OptimizerSpec spec;
  spec.name = "adam";
  spec.flags = [](FlagSet& flags) {
    flags.add("adam-betas", "betas of Adam, e.g. '(0.9, 0.999)' or 0.9,0.999", "(0.9, 0.999)", "B1,B2")
        .add("adam-eps", "epsilon of Adam", "1e-8", "EPS");
  };
  spec.configure = [](const FlagValues& args, const CommonOptimFlags& common) -> OptimizerFactory {
    const auto betas = parse_double_list("--adam-betas", args.text("adam-betas"));
    if (betas.size() != 2) {
      throw UsageError(fmt::format("--adam-betas: expected two values like '(0.9, 0.999)', got {}", betas.size()));
    }
    AdamOptions o;
    o.lr = common.lrs.front();
    o.beta1 = betas[0];
    o.beta2 = betas[1];
    o.eps = args.number("adam-eps");
    o.weight_decay = common.weight_decay;
    return [o](std::vector<torch::Tensor> params) { return std::make_unique<Adam>(std::move(params), o); };
  };
  return spec;
}

}  // namespace hetseq::optim
