#include "hetseq/optim/sgd.h"

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

const SgdOptions& validated(const SgdOptions& o) {
  if (!std::isfinite(o.lr) || o.lr < 0) {
    throw UsageError(fmt::format("--lr: the learning rate must be a finite number >= 0, got {}", o.lr));
  }
  if (!std::isfinite(o.momentum) || o.momentum < 0) {
    throw UsageError(fmt::format("--momentum: must be a finite number >= 0, got {}", o.momentum));
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) {
    throw UsageError(fmt::format("--weight-decay: must be a finite number >= 0, got {}", o.weight_decay));
  }
  return o;
}

}  // namespace

Sgd::Sgd(std::vector<torch::Tensor> params, const SgdOptions& options)
    : Optimizer(std::move(params), validated(options).lr), options_(options) {}

std::vector<std::string> Sgd::buffer_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void Sgd::step() {
  // One _foreach_* call per operation and group: see Note [Update groups].
  apply_update([this](UpdateGroup& group) {
    std::vector<torch::Tensor> d_p =  // [member]
        options_.weight_decay != 0 ? at::_foreach_add(group.grads, group.params, options_.weight_decay) : group.grads;
    if (options_.momentum != 0) {
      std::vector<torch::Tensor> bufs, adds;  // [member with a buffer]
      for (size_t k = 0; k < group.index.size(); ++k) {
        const size_t i = group.index[k];
        if (!has_buffer(i, "momentum_buffer")) {
          set_buffer(i, "momentum_buffer", d_p[k].clone());  // the parameter's first update with momentum
        } else {
          bufs.push_back(buffer(i, "momentum_buffer", group.params[k]));
          adds.push_back(d_p[k]);
        }
      }
      if (!bufs.empty()) {
        at::_foreach_mul_(bufs, options_.momentum);
        at::_foreach_add_(bufs, adds);
      }
      d_p = buffers(group, "momentum_buffer");
    }
    at::_foreach_add_(group.params, d_p, -lr());
  });
}

std::map<std::string, double> Sgd::hyperparameters() const {
  return {{"momentum", options_.momentum}, {"weight_decay", options_.weight_decay}};
}

void Sgd::set_hyperparameter(const std::string& name, double value) {
  SgdOptions changed = options_;
  if (name == "momentum") {
    changed.momentum = value;
  } else if (name == "weight_decay") {
    changed.weight_decay = value;
  } else {
    throw UsageError(fmt::format("sgd has no hyper-parameter '{}'; it has momentum, weight_decay", name));
  }
  options_ = validated(changed);
}

OptimizerSpec sgd_spec() {
  OptimizerSpec spec;
  spec.name = "sgd";
  spec.flags = [](FlagSet& flags) { flags.add("momentum", "momentum of SGD", flag_text(SgdOptions{}.momentum), "M"); };
  spec.configure = [](const FlagValues& args, const CommonOptimOptions& common) -> OptimizerFactory {
    SgdOptions o;
    o.lr = common.lrs.front();
    o.momentum = args.number("momentum");
    o.weight_decay = common.weight_decay;
    return [o](std::vector<torch::Tensor> params) { return std::make_unique<Sgd>(std::move(params), o); };
  };
  return spec;
}

}  // namespace hetseq::optim
