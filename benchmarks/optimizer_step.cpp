// The optimizer step and the gradient-norm pass on BERT-small's parameters (tasks/bert's BertForPreTraining
// with 4 layers, hidden 512, 8 heads, intermediate 2048, vocabulary 30522), before and after they moved to
// foreach and fused kernels (Note [Update groups], Note [Fused Adam], Note [Gradient norm in one pass]).
//
//   build/bin/optimizer-step [REPEATS]   (default 9)
//
// "old" is the per-parameter loop that the optimizers used before, kept here as the reference: the same
// formulas, one tensor at a time. "new" is hetseq::optim's Adam (fused, the default, and with fused = false,
// through _foreach_* kernels, in cache-sized chunks on the CPU: Note [Update groups]), Sgd and Adadelta. The gradient-norm rows run the kernel sequence of
// Controller::normalise_and_clip before and after (divide by N * S, norm in float64, one host read, clip),
// plus a float32-accumulated norm for comparison; Adadelta also runs its foreach calls over the whole model at
// once, without the CPU chunks. Every variant updates its own copy of the parameters with
// the same gradients; the variants take turns within each repeat, and each figure is the median (and the
// minimum, less disturbed by other work on a shared machine) over the repeats of one step's wall time. The program also checks that the foreach variants are bit-equal to the
// old ones and prints how far the fused Adam is, in float32 ulps of the larger of a parameter and its movement.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/parse.h"
#include "hetseq/optim.h"
#include "tasks/bert/bert_config.h"
#include "tasks/bert/bert_model.h"

namespace {

using Clock = std::chrono::steady_clock;
using torch::Tensor;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<Tensor> copies(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;  // [param]
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

void set_grads(std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined()) params[i].mutable_grad() = torch::empty_like(params[i]);
    params[i].mutable_grad().copy_(grads[i]);
  }
}

/// The optimizers' step before this change: one parameter at a time (the formulas of adam.h, sgd.h,
/// adadelta.h), with buffers per parameter. All parameters here are fp32 and updated every step.
class PerParameterStep {
 public:
  using Update = std::function<void(Tensor& p, const Tensor& g, std::map<std::string, Tensor>& buf, int64_t t)>;
  PerParameterStep(std::vector<Tensor> params, Update update)
      : params_(std::move(params)), update_(std::move(update)), buffers_(params_.size()) {}
  void step() {
    torch::NoGradGuard no_grad;
    ++t_;
    for (size_t i = 0; i < params_.size(); ++i) update_(params_[i], params_[i].grad(), buffers_[i], t_);
  }
  std::vector<Tensor>& params() { return params_; }

 private:
  std::vector<Tensor> params_;                          // [param]
  Update update_;
  std::vector<std::map<std::string, Tensor>> buffers_;  // [param][buffer name]
  int64_t t_ = 0;
};

Tensor& buffer(std::map<std::string, Tensor>& b, const std::string& name, const Tensor& like) {
  Tensor& slot = b[name];
  if (!slot.defined()) slot = torch::zeros_like(like);
  return slot;
}

PerParameterStep::Update old_adam(const hetseq::optim::AdamOptions& o) {
  return [o](Tensor& p, const Tensor& g, std::map<std::string, Tensor>& b, int64_t step) {
    Tensor& exp_avg = buffer(b, "exp_avg", p);
    Tensor& exp_avg_sq = buffer(b, "exp_avg_sq", p);
    exp_avg.mul_(o.beta1).add_(g, 1 - o.beta1);
    exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
    const Tensor denom = exp_avg_sq.sqrt().add_(o.eps);
    const auto t = static_cast<double>(step);
    const double step_size = o.lr * std::sqrt(1 - std::pow(o.beta2, t)) / (1 - std::pow(o.beta1, t));
    if (o.weight_decay != 0) p.add_(p, -o.weight_decay * o.lr);
    p.addcdiv_(exp_avg, denom, -step_size);
  };
}

PerParameterStep::Update old_sgd(const hetseq::optim::SgdOptions& o) {
  return [o](Tensor& p, const Tensor& g, std::map<std::string, Tensor>& b, int64_t) {
    Tensor d_p = o.weight_decay != 0 ? g.add(p, o.weight_decay) : g;
    if (!b.count("momentum_buffer")) {
      b["momentum_buffer"] = d_p.clone();
    } else {
      b["momentum_buffer"].mul_(o.momentum).add_(d_p);
    }
    p.add_(b["momentum_buffer"], -o.lr);
  };
}

PerParameterStep::Update old_adadelta(const hetseq::optim::AdadeltaOptions& o) {
  return [o](Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& b, int64_t) {
    Tensor& square_avg = buffer(b, "square_avg", p);
    Tensor& acc_delta = buffer(b, "acc_delta", p);
    const Tensor g = o.weight_decay != 0 ? grad.add(p, o.weight_decay) : grad;
    square_avg.mul_(o.rho).addcmul_(g, g, 1 - o.rho);
    const Tensor std_dev = square_avg.add(o.eps).sqrt_();
    const Tensor delta = acc_delta.add(o.eps).sqrt_().div_(std_dev).mul_(g);
    p.add_(delta, -o.lr);
    acc_delta.mul_(o.rho).addcmul_(delta, delta, 1 - o.rho);
  };
}

/// Whether `a` and `b` are equal, and their largest difference in float32 ulps of the larger of the
/// parameter and how far it moved from `start` (a parameter that crosses zero has no relative error).
std::pair<double, bool> compare(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                                const std::vector<Tensor>& start) {
  double worst = 0;
  bool equal = true;
  for (size_t i = 0; i < a.size(); ++i) {
    equal = equal && torch::equal(a[i], b[i]);
    const Tensor x = a[i].detach().to(torch::kFloat64), y = b[i].detach().to(torch::kFloat64);
    const Tensor scale = torch::max(y.abs(), (y - start[i].to(torch::kFloat64)).abs()) * std::ldexp(1.0, -23);
    worst = std::max(worst, ((x - y).abs() / (scale + 1e-45)).max().item<double>());
  }
  return {worst, equal};
}

struct Variant {
  std::string name;
  std::function<void()> step;
  std::vector<Tensor>* params;
  std::vector<double> ms;
};

/// Runs every variant `repeats` times after `warmup` untimed steps, in turn, each step on the same gradients.
void measure(std::vector<Variant>& variants, const std::vector<Tensor>& grads, int repeats, int warmup = 2) {
  for (int r = -warmup; r < repeats; ++r) {
    for (auto& v : variants) {
      set_grads(*v.params, grads);
      const auto t0 = Clock::now();
      v.step();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (r >= 0) v.ms.push_back(ms);
    }
  }
}

void report(const std::string& what, const std::vector<Variant>& variants) {
  const double old_ms = median(variants.front().ms);
  const double old_min = *std::min_element(variants.front().ms.begin(), variants.front().ms.end());
  for (const auto& v : variants) {
    const double ms = median(v.ms);
    const double min = *std::min_element(v.ms.begin(), v.ms.end());
    std::printf("%-28s %-22s median %8.2f ms/step (old/new %5.2fx)   min %8.2f ms (old/new %5.2fx)\n", what.c_str(),
                v.name.c_str(), ms, old_ms / ms, min, old_min / min);
  }
}

void report_accuracy(const std::string& what, const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                     const std::vector<Tensor>& start) {
  const auto [worst, equal] = compare(a, b, start);
  std::printf("%-28s after all steps: %s (largest difference %.3g float32 ulp)\n", what.c_str(),
              equal ? "bit-equal to old" : "differs from old", worst);
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? static_cast<int>(hetseq::parse_int("REPEATS", argv[1])) : 9;
  torch::manual_seed(0);
  hetseq::bert::BertConfig config;
  config.num_hidden_layers = 4;
  config.hidden_size = 512;
  config.num_attention_heads = 8;
  config.intermediate_size = 2048;
  const std::vector<Tensor> base = hetseq::bert::BertForPreTraining(config)->parameters();
  std::vector<Tensor> grads;  // [param]
  int64_t numel = 0;
  for (const auto& p : base) {
    grads.push_back(torch::randn_like(p) * 1e-3);
    numel += p.numel();
  }
  std::printf("BERT-small (4 layers, hidden 512): %zu parameter tensors, %lld parameters, fp32; %d intra-op "
              "threads; median of %d steps\n",
              base.size(), static_cast<long long>(numel), torch::get_num_threads(), repeats);

  {
    hetseq::optim::AdamOptions o;
    o.lr = 1e-4;
    o.weight_decay = 0.01;
    PerParameterStep old(copies(base), old_adam(o));
    o.fused = false;
    hetseq::optim::Adam foreach_adam(copies(base), o);
    o.fused = true;
    hetseq::optim::Adam fused_adam(copies(base), o);
    std::vector<Tensor> foreach_params = foreach_adam.params(), fused_params = fused_adam.params();
    std::vector<Variant> v{{"old (per parameter)", [&] { old.step(); }, &old.params(), {}},
                           {"new foreach", [&] { foreach_adam.step(); }, &foreach_params, {}},
                           {"new fused (default)", [&] { fused_adam.step(); }, &fused_params, {}}};
    measure(v, grads, repeats);
    report("adam (weight decay 0.01)", v);
    report_accuracy("adam foreach", foreach_params, old.params(), base);
    report_accuracy("adam fused", fused_params, old.params(), base);
  }
  {
    hetseq::optim::SgdOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    PerParameterStep old(copies(base), old_sgd(o));
    hetseq::optim::Sgd sgd(copies(base), o);
    std::vector<Tensor> params = sgd.params();
    std::vector<Variant> v{{"old (per parameter)", [&] { old.step(); }, &old.params(), {}},
                           {"new foreach", [&] { sgd.step(); }, &params, {}}};
    measure(v, grads, repeats);
    report("sgd (momentum 0.9)", v);
    report_accuracy("sgd foreach", params, old.params(), base);
  }
  {
    hetseq::optim::AdadeltaOptions o;
    PerParameterStep old(copies(base), old_adadelta(o));
    hetseq::optim::Adadelta adadelta(copies(base), o);
    std::vector<Tensor> params = adadelta.params();
    // Adadelta's foreach calls over the whole model at once, without the CPU chunks of Note [Update groups].
    std::vector<Tensor> whole = copies(base), square_avg, acc_delta;  // [param]
    for (const auto& p : whole) {
      square_avg.push_back(torch::zeros_like(p));
      acc_delta.push_back(torch::zeros_like(p));
    }
    const auto whole_step = [&] {
      torch::NoGradGuard no_grad;
      std::vector<Tensor> g;  // [param]
      for (const auto& p : whole) g.push_back(p.grad());
      at::_foreach_mul_(square_avg, o.rho);
      at::_foreach_addcmul_(square_avg, g, g, 1 - o.rho);
      std::vector<Tensor> std_dev = at::_foreach_add(square_avg, o.eps);
      at::_foreach_sqrt_(std_dev);
      std::vector<Tensor> delta = at::_foreach_add(acc_delta, o.eps);
      at::_foreach_sqrt_(delta);
      at::_foreach_div_(delta, std_dev);
      at::_foreach_mul_(delta, g);
      at::_foreach_add_(whole, delta, -o.lr);
      at::_foreach_mul_(acc_delta, o.rho);
      at::_foreach_addcmul_(acc_delta, delta, delta, 1 - o.rho);
    };
    std::vector<Variant> v{{"old (per parameter)", [&] { old.step(); }, &old.params(), {}},
                           {"new foreach", [&] { adadelta.step(); }, &params, {}},
                           {"foreach, unchunked", whole_step, &whole, {}}};
    measure(v, grads, repeats);
    report("adadelta", v);
    report_accuracy("adadelta foreach", params, old.params(), base);
  }
  {
    // Controller::normalise_and_clip's kernels, before and after, with a clip that applies.
    const double divisor = 1024, clip_norm = 1e-3;
    std::vector<Tensor> old_params = copies(base), new_params = copies(base), f32_params = copies(base);
    double old_norm = 0, new_norm = 0, f32_norm = 0;
    const auto grads_of = [](const std::vector<Tensor>& params) {
      std::vector<Tensor> out;  // [param]
      for (const auto& p : params) out.push_back(p.grad());
      return out;
    };
    const auto old_pass = [&] {
      torch::NoGradGuard no_grad;
      std::vector<Tensor> gs = grads_of(old_params);
      for (auto& g : gs) g.div_(divisor);
      std::vector<Tensor> norms;
      for (const auto& g : gs) norms.push_back(g.to(torch::kFloat64).norm());
      old_norm = torch::stack(norms).norm().item<double>();
      if (old_norm > clip_norm) {
        for (auto& g : gs) g.mul_(clip_norm / (old_norm + 1e-6));
      }
    };
    const auto new_pass = [&](std::vector<Tensor>& params, double& norm, std::optional<torch::ScalarType> dtype) {
      torch::NoGradGuard no_grad;
      std::vector<Tensor> gs = grads_of(params);  // one dtype group here: all fp32 on the CPU
      at::_foreach_div_(gs, divisor);
      norm = torch::stack(at::_foreach_norm(gs, 2, dtype)).to(torch::kFloat64).norm().item<double>();
      if (norm > clip_norm) at::_foreach_mul_(gs, clip_norm / (norm + 1e-6));
    };
    std::vector<Variant> v{
        {"old (per tensor)", old_pass, &old_params, {}},
        {"new foreach, float64", [&] { new_pass(new_params, new_norm, torch::kFloat64); }, &new_params, {}},
        {"foreach, float32 norm", [&] { new_pass(f32_params, f32_norm, std::nullopt); }, &f32_params, {}}};
    measure(v, grads, repeats);
    report("grad norm + clip", v);
    std::printf("%-28s norms: old %.17g, new %.17g (%s), float32 %.17g\n", "grad norm + clip", old_norm, new_norm,
                old_norm == new_norm ? "bit-equal" : "differ", f32_norm);
    report_accuracy("grad norm + clip, new grads", grads_of(new_params), grads_of(old_params), grads);
  }
  return 0;
}
