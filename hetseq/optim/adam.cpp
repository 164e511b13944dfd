#include "hetseq/optim/adam.h"

#include <cmath>
#include <utility>

#include "hetseq/core/format.h"
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/optim/registry.h"
#include "hetseq/core/parse.h"
#include "hetseq/core/flag_text.h"

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

// Note [Fused Adam]
// ~~~~~~~~~~~~~~~~~
// fairseq's Adam (adam.h) puts epsilon outside the bias correction of the second moment:
//   p -= lr * sqrt(bc2) / bc1 * m / (sqrt(v) + eps)            with bc1 = 1 - beta1^t, bc2 = 1 - beta2^t
// LibTorch's fused kernel (_fused_adamw_, on CPU and CUDA) computes torch.optim.AdamW's form,
//   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps')
// which is the same update when eps' = eps / sqrt(bc2): multiply its numerator and denominator by sqrt(bc2).
// eps' depends on t, one reason why a group shares its update count (Note [Update groups]). Its decoupled
// weight decay, p *= 1 - lr * weight_decay, is fairseq's p -= weight_decay * lr * p.
//
// The result is close to the per-operation form, not equal: the kernel keeps each element in registers
// through the whole update (no rounding of m, v and the denominator to memory in between, maybe fused
// multiply-adds), it updates m with a lerp, and it divides by sqrt(bc2) instead of multiplying by it. Each
// step differs by a few ulp per element (tests/optim/test_foreach_optimizers.cpp bounds it). The update is
// still deterministic, so W ranks and one process, or a run and its resume, stay bit-equal to each other.
// The kernel reads the update count from a float tensor per member and does not increment it.

namespace {

/// The moments' update, m = beta1 m + (1 - beta1) g and v = beta2 v + (1 - beta2) g g; returns sqrt(v) [member],
/// which both forms below turn into the denominator.
std::vector<torch::Tensor> update_moments(const AdamOptions& o, const std::vector<torch::Tensor>& grads,
                                          std::vector<torch::Tensor>& exp_avg, std::vector<torch::Tensor>& exp_avg_sq) {
  at::_foreach_mul_(exp_avg, o.beta1);
  at::_foreach_add_(exp_avg, grads, 1 - o.beta1);
  at::_foreach_mul_(exp_avg_sq, o.beta2);
  at::_foreach_addcmul_(exp_avg_sq, grads, grads, 1 - o.beta2);
  return at::_foreach_sqrt(exp_avg_sq);
}

/// fairseq's Adam, one _foreach_* call per operation: on a CPU bit-equal to the per-parameter form.
void foreach_adam(const AdamOptions& o, double lr, int64_t step, std::vector<torch::Tensor>& params,
                  const std::vector<torch::Tensor>& grads, std::vector<torch::Tensor>& exp_avg,
                  std::vector<torch::Tensor>& exp_avg_sq) {
  std::vector<torch::Tensor> denom = update_moments(o, grads, exp_avg, exp_avg_sq);  // [member]
  at::_foreach_add_(denom, o.eps);

  const auto t = static_cast<double>(step);
  const double bias_correction1 = 1 - std::pow(o.beta1, t);
  const double bias_correction2 = 1 - std::pow(o.beta2, t);
  const double step_size = lr * std::sqrt(bias_correction2) / bias_correction1;

  // The decay as a product, then a sum (not add's alpha, a fused multiply-add on a CPU's vector units): the
  // order that device_scalar_adam can follow with its factor in a tensor.
  if (o.weight_decay != 0) at::_foreach_add_(params, at::_foreach_mul(params, -o.weight_decay * lr));
  at::_foreach_addcdiv_(params, exp_avg, denom, -step_size);
}

// Note [Adam from device scalars]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CUDA graph replays its kernels with the arguments they were captured with: a host number passed to a kernel
// (the step size, which moves with the update count t; epsilon; the weight decay's lr-dependent factor) would be
// frozen at capture. With AdamOptions::device_scalars they live in zero-dimensional tensors on the parameters'
// device, which the host fills before the kernels run (fill_ is its own small kernel, outside what a graph
// captures), and the kernels read them there: _foreach_* calls whose scalar operand is a tensor. The arithmetic
// is the foreach form's, operation for operation: m and v as there; denom = sqrt(v) + eps; the decay p + (-wd lr) p
// as a product then a sum; the step (-step_size * m) / denom added to p, the order in which addcdiv evaluates
// value * t1 / t2. So on a CPU the two forms are bit-equal (tests/optim/test_foreach_optimizers.cpp): the scalars
// are the same roundings of the same doubles, to float64 for float64 members and to float32 for the others.
// --cuda-graph captures the kernels and fills the scalars before each replay: Note [The step in a CUDA graph].

/// fairseq's Adam with its scalars in `scalars` ([3]: -step size, -weight_decay * lr, epsilon; zero-dimensional
/// tensors of the members' compute type on their device).
void device_scalar_adam(const AdamOptions& o, const torch::Tensor* scalars, std::vector<torch::Tensor>& params,
                        const std::vector<torch::Tensor>& grads, std::vector<torch::Tensor>& exp_avg,
                        std::vector<torch::Tensor>& exp_avg_sq) {
  std::vector<torch::Tensor> denom = update_moments(o, grads, exp_avg, exp_avg_sq);  // [member]
  at::_foreach_add_(denom, scalars[2]);
  if (o.weight_decay != 0) at::_foreach_add_(params, at::_foreach_mul(params, scalars[1]));
  std::vector<torch::Tensor> step = at::_foreach_mul(exp_avg, scalars[0]);  // [member]
  at::_foreach_div_(step, denom);
  at::_foreach_add_(params, step);
}

/// The same update through the fused kernel. See Note [Fused Adam].
void fused_adam(const AdamOptions& o, double lr, int64_t step, std::vector<torch::Tensor>& params,
                std::vector<torch::Tensor>& grads, std::vector<torch::Tensor>& exp_avg,
                std::vector<torch::Tensor>& exp_avg_sq) {
  const auto t = static_cast<double>(step);
  const double bias_correction2 = 1 - std::pow(o.beta2, t);
  // One float per member holding t, on the members' device (the kernel only reads them).
  const std::vector<torch::Tensor> steps =
      torch::full({static_cast<int64_t>(params.size())}, t, params.front().options().dtype(torch::kFloat))
          .unbind(0);  // [member]
  at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, lr, o.beta1, o.beta2,
                    o.weight_decay, o.eps / std::sqrt(bias_correction2), /*amsgrad=*/false, /*maximize=*/false);
}

/// Whether the fused kernel can take member k: it walks the memory of the parameter, gradient and buffers
/// in step, so all must be dense with the parameter's dtype and layout.
bool fusable(const torch::Tensor& p, const torch::Tensor& g, const torch::Tensor& m, const torch::Tensor& v) {
  for (const torch::Tensor* t : {&p, &g, &m, &v}) {
    if (!t->is_contiguous() || t->scalar_type() != p.scalar_type()) return false;
  }
  return true;
}

}  // namespace

void Adam::step() {
  if (options_.device_scalars) {
    prepare_step();
    run_step();
    return;
  }
  apply_update([this](UpdateGroup& group) {
    std::vector<torch::Tensor> exp_avg = buffers(group, "exp_avg");        // [member]
    std::vector<torch::Tensor> exp_avg_sq = buffers(group, "exp_avg_sq");  // [member]
    if (!options_.fused) {
      foreach_adam(options_, lr(), group.step, group.params, group.grads, exp_avg, exp_avg_sq);
      return;
    }
    // [fused member], [other member]: a non-contiguous member goes through the foreach kernels.
    std::vector<torch::Tensor> fp, fg, fm, fv, op, og, om, ov;
    for (size_t k = 0; k < group.params.size(); ++k) {
      const bool fuse = fusable(group.params[k], group.grads[k], exp_avg[k], exp_avg_sq[k]);
      (fuse ? fp : op).push_back(group.params[k]);
      (fuse ? fg : og).push_back(group.grads[k]);
      (fuse ? fm : om).push_back(exp_avg[k]);
      (fuse ? fv : ov).push_back(exp_avg_sq[k]);
    }
    if (!fp.empty()) fused_adam(options_, lr(), group.step, fp, fg, fm, fv);
    if (!op.empty()) foreach_adam(options_, lr(), group.step, op, og, om, ov);
  });
}

// Note [The step in a CUDA graph]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A step has a host part and a device part. The host counts it (num_steps, each parameter's update count) and
// works out its numbers (the step size from lr and the count, the decay factor, epsilon); the device runs the
// kernels. A CUDA graph replays only the device part, with the addresses it was captured with, so under
// device_scalars (Note [Adam from device scalars]) the two are apart: prepare_step() counts and fills the
// scalars (fill_, outside any graph), run_step() runs the kernels that read them. --cuda-graph captures
// run_step() with the update and calls prepare_step() before each replay (Note [CUDA-graph updates]): each
// replay's step then has its own count and learning rate, and the host's counts stay those of an eager run (a
// checkpoint saves them). Both walk the same groups in the same order (for_each_group; the layout depends on the
// devices, dtypes, sizes and counts, which stay the same while every parameter takes a gradient every update),
// so group k's kernels read the scalars that prepare_step filled for group k. step() is prepare_step() then
// run_step(), bit-equal on a CPU to the foreach form.
void Adam::prepare_step() {
  HETSEQ_ASSERT(options_.device_scalars, "Adam::prepare_step without device_scalars");
  count_step();
  size_t group_index = 0;
  for_each_group(
      [this, &group_index](UpdateGroup& group) {
        const size_t first = 3 * group_index++;
        // In the members' compute type: float64 for float64 members, float32 for the others (fp16 and bf16
        // members are stepped in float32, Note [Update groups]).
        const torch::TensorOptions like = group.params.front().options().dtype(
            group.params.front().scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat);
        while (scalars_.size() < first + 3) scalars_.push_back(torch::zeros({}, like));
        for (size_t k = first; k < first + 3; ++k) {
          if (scalars_[k].dtype() != like.dtype() || scalars_[k].device() != like.device()) {
            scalars_[k] = torch::zeros({}, like);
          }
        }
        const auto t = static_cast<double>(group.step);
        const double step_size = lr() * std::sqrt(1 - std::pow(options_.beta2, t)) / (1 - std::pow(options_.beta1, t));
        scalars_[first].fill_(-step_size);
        scalars_[first + 1].fill_(-options_.weight_decay * lr());
        scalars_[first + 2].fill_(options_.eps);
      },
      /*copies=*/false);
}

void Adam::run_step() {
  HETSEQ_ASSERT(options_.device_scalars, "Adam::run_step without device_scalars");
  size_t group_index = 0;
  for_each_group([this, &group_index](UpdateGroup& group) {
    const size_t first = 3 * group_index++;
    HETSEQ_ASSERT(first + 3 <= scalars_.size(), "Adam::run_step: group {} has no scalars (prepare_step first)",
                  first / 3);
    std::vector<torch::Tensor> exp_avg = buffers(group, "exp_avg");        // [member]
    std::vector<torch::Tensor> exp_avg_sq = buffers(group, "exp_avg_sq");  // [member]
    device_scalar_adam(options_, &scalars_[first], group.params, group.grads, exp_avg, exp_avg_sq);
  });
}

std::vector<torch::Tensor> Adam::step_tensors() const {
  std::vector<torch::Tensor> out = Optimizer::step_tensors();
  out.insert(out.end(), scalars_.begin(), scalars_.end());
  return out;
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
    const AdamOptions d;
    flags.add("adam-betas", "betas of Adam, e.g. '(0.9, 0.999)' or 0.9,0.999",
              fmt::format("({}, {})", d.beta1, d.beta2), "B1,B2")
        .add("adam-eps", "epsilon of Adam", flag_text(d.eps), "EPS");
  };
  spec.configure = [](const FlagValues& args, const CommonOptimOptions& common) -> OptimizerFactory {
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
