#include "hetseq/optim/adadelta.h"

#include <cmath>
#include <utility>
#include <vector>

#include "hetseq/core/format.h"
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/optim/registry.h"
#include "hetseq/core/parse.h"
#include "hetseq/core/flag_text.h"

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
  // One _foreach_* call per operation and group: see Note [Update groups].
  apply_update([this](UpdateGroup& group) {
    const double rho = options_.rho;
    const double eps = options_.eps;
    std::vector<torch::Tensor> square_avg = buffers(group, "square_avg");  // [member]
    std::vector<torch::Tensor> acc_delta = buffers(group, "acc_delta");    // [member]

    const std::vector<torch::Tensor> g =  // [member]
        options_.weight_decay != 0 ? at::_foreach_add(group.grads, group.params, options_.weight_decay) : group.grads;
    at::_foreach_mul_(square_avg, rho);
    at::_foreach_addcmul_(square_avg, g, g, 1 - rho);
    std::vector<torch::Tensor> std_dev = at::_foreach_add(square_avg, eps);  // [member]
    at::_foreach_sqrt_(std_dev);
    std::vector<torch::Tensor> delta = at::_foreach_add(acc_delta, eps);  // [member]
    at::_foreach_sqrt_(delta);
    at::_foreach_div_(delta, std_dev);
    at::_foreach_mul_(delta, g);
    at::_foreach_add_(group.params, delta, -lr());
    at::_foreach_mul_(acc_delta, rho);
    at::_foreach_addcmul_(acc_delta, delta, delta, 1 - rho);
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
    const AdadeltaOptions d;
    flags.add("adadelta_rho", "rho of Adadelta", flag_text(d.rho), "RHO")
        .add("adadelta_eps", "epsilon of Adadelta", flag_text(d.eps), "EPS")
        .add("adadelta_weight_decay", "L2 weight decay of Adadelta", flag_text(d.weight_decay), "WD");
  };
  spec.configure = [](const FlagValues& args, const CommonOptimOptions& common) -> OptimizerFactory {
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
