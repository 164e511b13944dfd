// The optimizers step through foreach and fused kernels, one call per group of parameters (Note [Update
// groups]). Here they are compared with the per-parameter update they replaced, written out below one tensor
// at a time exactly as the old step() evaluated it, over several steps with weight decay, parameters of three
// dtypes (fp16 ones updated through fp32 copies), a non-contiguous parameter, a group updated in two chunks,
// and a parameter that misses a gradient on one step and so counts fewer updates than the rest:
//   - SGD, Adadelta and Adam with AdamOptions::fused = false: bit-equal. On a CPU the _foreach_* kernels run
//     the per-tensor operation on each member in turn.
//   - Adam through the fused kernel (the default): close, not equal. The kernel keeps an element in registers
//     through the whole update and puts epsilon inside the bias correction (Note [Fused Adam]); from the same
//     state, one step is within a few float32 ulp of the per-parameter step.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/format.h"
#include "hetseq/optim.h"

using hetseq::optim::Adadelta;
using hetseq::optim::AdadeltaOptions;
using hetseq::optim::Adam;
using hetseq::optim::AdamOptions;
using hetseq::optim::Optimizer;
using hetseq::optim::Sgd;
using hetseq::optim::SgdOptions;
using torch::Tensor;

namespace {

/// The update of one parameter: (its 1-based update count, the parameter and gradient in the compute
/// precision, its buffers by name).
using RefUpdate = std::function<void(int64_t t, Tensor& p, const Tensor& g, std::map<std::string, Tensor>& buf)>;

/// The per-parameter optimizer the foreach ones replaced: a loop over the parameters, fp16/bf16 ones updated
/// through fp32 copies, buffers created as zeros at a parameter's first update, and the checkpoint form of
/// Note [Optimizer state].
class PerParamRef {
 public:
  PerParamRef(std::vector<Tensor> params, RefUpdate update)
      : params_(std::move(params)), update_(std::move(update)), steps_(params_.size(), 0), buffers_(params_.size()) {}

  void step() {
    torch::NoGradGuard no_grad;
    ++num_steps_;
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& p = params_[i];
      if (!p.grad().defined()) continue;
      ++steps_[i];
      if (p.scalar_type() == torch::kHalf || p.scalar_type() == torch::kBFloat16) {
        Tensor work = p.to(torch::kFloat);
        update_(steps_[i], work, p.grad().to(torch::kFloat), buffers_[i]);
        p.copy_(work);
      } else {
        update_(steps_[i], p, p.grad(), buffers_[i]);
      }
    }
  }

  std::map<std::string, Tensor> state(double lr) const {
    std::map<std::string, Tensor> out;
    out["lr"] = torch::scalar_tensor(lr, torch::kFloat64);
    out["num_steps"] = torch::scalar_tensor(num_steps_, torch::kInt64);
    out["num_params"] = torch::scalar_tensor(static_cast<int64_t>(params_.size()), torch::kInt64);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (steps_[i] == 0) continue;
      out[fmt::format("param.{}.step", i)] = torch::scalar_tensor(steps_[i], torch::kInt64);
      for (const auto& [name, value] : buffers_[i]) out[fmt::format("param.{}.{}", i, name)] = value.clone();
    }
    return out;
  }

  const std::vector<Tensor>& params() const { return params_; }

 private:
  std::vector<Tensor> params_;  // [param]
  RefUpdate update_;
  int64_t num_steps_ = 0;
  std::vector<int64_t> steps_;                           // [param]
  std::vector<std::map<std::string, Tensor>> buffers_;  // [param][buffer name]
};

Tensor& buf(std::map<std::string, Tensor>& buffers, const std::string& name, const Tensor& like) {
  Tensor& slot = buffers[name];
  if (!slot.defined()) slot = torch::zeros_like(like, torch::MemoryFormat::Preserve);
  return slot;
}

/// fairseq's Adam, the formula of adam.h one operation at a time.
RefUpdate adam_ref(const AdamOptions& o) {
  return [o](int64_t step, Tensor& p, const Tensor& g, std::map<std::string, Tensor>& b) {
    Tensor& exp_avg = buf(b, "exp_avg", p);
    Tensor& exp_avg_sq = buf(b, "exp_avg_sq", p);
    exp_avg.mul_(o.beta1).add_(g, 1 - o.beta1);
    exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
    const Tensor denom = exp_avg_sq.sqrt().add_(o.eps);
    const auto t = static_cast<double>(step);
    const double step_size = o.lr * std::sqrt(1 - std::pow(o.beta2, t)) / (1 - std::pow(o.beta1, t));
    if (o.weight_decay != 0) p.add_(p * (-o.weight_decay * o.lr));  // a product, then a sum (adam.cpp)
    p.addcdiv_(exp_avg, denom, -step_size);
  };
}

/// torch.optim.SGD with momentum, the formula of sgd.h.
RefUpdate sgd_ref(const SgdOptions& o) {
  return [o](int64_t, Tensor& p, const Tensor& g, std::map<std::string, Tensor>& b) {
    Tensor d_p = o.weight_decay != 0 ? g.add(p, o.weight_decay) : g;
    if (!b.count("momentum_buffer")) {
      b["momentum_buffer"] = d_p.clone();
    } else {
      b["momentum_buffer"].mul_(o.momentum).add_(d_p);
    }
    p.add_(b["momentum_buffer"], -o.lr);
  };
}

/// torch.optim.Adadelta, the formula of adadelta.h.
RefUpdate adadelta_ref(const AdadeltaOptions& o) {
  return [o](int64_t, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& b) {
    Tensor& square_avg = buf(b, "square_avg", p);
    Tensor& acc_delta = buf(b, "acc_delta", p);
    const Tensor g = o.weight_decay != 0 ? grad.add(p, o.weight_decay) : grad;
    square_avg.mul_(o.rho).addcmul_(g, g, 1 - o.rho);
    const Tensor std_dev = square_avg.add(o.eps).sqrt_();
    const Tensor delta = acc_delta.add(o.eps).sqrt_().div_(std_dev).mul_(g);
    p.add_(delta, -o.lr);
    acc_delta.mul_(o.rho).addcmul_(delta, delta, 1 - o.rho);
  };
}

/// Seven parameters in three groups by dtype: fp32 ones of several shapes (a 0-dim one, a transposed one
/// whose gradient is contiguous, so their strides differ, and one larger than a CPU chunk, so that the fp32
/// group is updated in two chunks: Note [Update groups]), an fp64 one and an fp16 one.
std::vector<Tensor> make_params(uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({7, 5}).requires_grad_(true),
          torch::randn({5}).requires_grad_(true),
          torch::randn({}).requires_grad_(true),
          torch::randn({4, 6}).t().requires_grad_(true),
          torch::randn({3, 4, 2}, torch::kFloat64).requires_grad_(true),
          torch::randn({9}).to(torch::kHalf).requires_grad_(true),
          torch::randn({300, 300}).requires_grad_(true)};
}

std::vector<Tensor> clones(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

/// Gives every parameter of `a` and `b` the same random gradient, except parameter 1 at step 3: no gradient,
/// so from then on it counts one update fewer than the others (a group of its own).
void set_grads(int step, std::vector<Tensor> a, std::vector<Tensor> b) {
  torch::manual_seed(1000 + static_cast<uint64_t>(step));
  for (size_t i = 0; i < a.size(); ++i) {
    if (step == 3 && i == 1) {
      a[i].mutable_grad().reset();
      b[i].mutable_grad().reset();
      continue;
    }
    const Tensor g = (torch::randn(a[i].sizes(), torch::kFloat64) * (0.5 + static_cast<double>(i))).to(a[i].dtype());
    a[i].mutable_grad() = g.clone();
    b[i].mutable_grad() = g.clone();
  }
}

/// Steps `opt` and `ref` (over equal copies of the same parameters) six times and requires bit-equal
/// parameters and checkpoint states after each step.
void require_bit_equal_steps(Optimizer& opt, PerParamRef& ref) {
  for (int step = 1; step <= 6; ++step) {
    set_grads(step, opt.params(), ref.params());
    opt.step();
    ref.step();
    for (size_t i = 0; i < opt.params().size(); ++i) {
      INFO("step " << step << ", parameter " << i);
      CHECK(opt.params()[i].scalar_type() == ref.params()[i].scalar_type());
      CHECK(torch::equal(opt.params()[i], ref.params()[i]));
    }
    const auto state = opt.state();
    const auto expected = ref.state(opt.lr());
    REQUIRE(state.size() == expected.size());
    for (const auto& [key, value] : expected) {
      INFO("step " << step << ", state entry " << key);
      REQUIRE(state.count(key) == 1);
      CHECK(state.at(key).scalar_type() == value.scalar_type());
      CHECK(torch::equal(state.at(key), value));
    }
  }
}

}  // namespace

TEST_CASE("SGD through foreach kernels is bit-equal to the per-parameter update", "[optim][foreach]") {
  SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.weight_decay = 0.05;
  const auto params = make_params(1);
  Sgd sgd(clones(params), o);
  PerParamRef ref(clones(params), sgd_ref(o));
  require_bit_equal_steps(sgd, ref);
}

TEST_CASE("Adadelta through foreach kernels is bit-equal to the per-parameter update", "[optim][foreach]") {
  AdadeltaOptions o;
  o.lr = 0.5;
  o.rho = 0.8;
  o.eps = 1e-4;
  o.weight_decay = 0.1;
  const auto params = make_params(2);
  Adadelta adadelta(clones(params), o);
  PerParamRef ref(clones(params), adadelta_ref(o));
  require_bit_equal_steps(adadelta, ref);
}

TEST_CASE("Adam through foreach kernels (fused = false) is bit-equal to the per-parameter update",
          "[optim][foreach]") {
  AdamOptions o;
  o.lr = 0.01;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.weight_decay = 0.01;
  o.fused = false;
  const auto params = make_params(3);
  Adam adam(clones(params), o);
  PerParamRef ref(clones(params), adam_ref(o));
  require_bit_equal_steps(adam, ref);
}

TEST_CASE("Adam with its scalars in device tensors (the form a CUDA graph replays) is bit-equal to the per-parameter "
          "update",
          "[optim][foreach]") {
  // Note [Adam from device scalars]: with and without weight decay, over the steps of require_bit_equal_steps.
  const double decay = GENERATE(0.0, 0.01);
  CAPTURE(decay);
  AdamOptions o;
  o.lr = 0.01;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.weight_decay = decay;
  o.device_scalars = true;
  const auto params = make_params(3);
  Adam adam(clones(params), o);
  PerParamRef ref(clones(params), adam_ref(o));
  require_bit_equal_steps(adam, ref);
}

namespace {

/// The largest difference between `actual` and `expected`, in units in the last place (of `expected`'s dtype)
/// of `scale` (same shape, >= 0): the magnitude that sets the unit.
double ulps(const Tensor& actual, const Tensor& expected, const Tensor& scale) {
  const double eps = expected.scalar_type() == torch::kFloat64 ? std::numeric_limits<double>::epsilon()
                     : expected.scalar_type() == torch::kHalf  ? 0.0009765625
                                                              : std::numeric_limits<float>::epsilon();
  const Tensor diff = (actual.to(torch::kFloat64) - expected.to(torch::kFloat64)).abs();
  return (diff / (scale.to(torch::kFloat64) * eps + std::numeric_limits<double>::denorm_min())).max().item<double>();
}

}  // namespace

TEST_CASE("Adam through the fused kernel is within a few ulp of the per-parameter update at every step",
          "[optim][foreach]") {
  AdamOptions o;
  o.lr = 0.01;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  const double weight_decay = GENERATE(0.0, 0.01);
  o.weight_decay = weight_decay;
  REQUIRE(o.fused);  // the default
  const auto params = make_params(4);
  PerParamRef ref(clones(params), adam_ref(o));
  Adam adam(clones(params), o);
  for (int step = 1; step <= 6; ++step) {
    INFO("weight decay " << weight_decay << ", step " << step);
    // From the same state: the reference's parameters and its checkpoint form, loaded.
    std::vector<Tensor> before;  // [param]
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        adam.params()[i].copy_(ref.params()[i]);
        before.push_back(ref.params()[i].detach().clone());
      }
    }
    const auto previous = ref.state(adam.lr());
    adam.load_state(previous);
    set_grads(step, adam.params(), ref.params());
    adam.step();
    ref.step();
    const auto state = adam.state();
    const auto expected = ref.state(adam.lr());
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("parameter " << i << " " << adam.params()[i].dtype());
      const Tensor& p = adam.params()[i];
      const Tensor& r = ref.params()[i];
      // The unit is set by the parameter, its update, and lr, the scale of an Adam update: where m's two terms
      // nearly cancel (below), m is off by an ulp of the terms, and so the update by about an ulp of lr. fp32
      // copies of fp16 parameters are rounded to fp16 at the end, where one fp32 ulp can round either way.
      const Tensor scale = r.abs() + (r - before[i]).abs() + o.lr;
      CHECK(ulps(p, r, scale) <= 4);
      if (!state.count(fmt::format("param.{}.step", i))) continue;  // no update yet
      CHECK(torch::equal(state.at(fmt::format("param.{}.step", i)), expected.at(fmt::format("param.{}.step", i))));
      // m moves by a lerp, m + (1 - beta1) * (g - m), not beta1 * m + (1 - beta1) * g: where the two terms
      // nearly cancel, the unit is set by the terms, not the result. v's terms are both >= 0.
      const std::string m_key = fmt::format("param.{}.exp_avg", i);
      const std::string v_key = fmt::format("param.{}.exp_avg_sq", i);
      const Tensor g = r.grad().defined() ? r.grad().to(torch::kFloat64).abs() : torch::zeros_like(r, torch::kFloat64);
      const Tensor m_scale = previous.count(m_key) ? previous.at(m_key).to(torch::kFloat64).abs() + g : g;
      CHECK(ulps(state.at(m_key), expected.at(m_key), m_scale) <= 4);
      CHECK(ulps(state.at(v_key), expected.at(v_key), expected.at(v_key).abs()) <= 4);
    }
  }
}

TEST_CASE("The fused and the foreach Adam read and write the same checkpoint form", "[optim][foreach]") {
  AdamOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.01;
  const auto params = make_params(5);
  Adam fused(clones(params), o);
  o.fused = false;
  Adam foreach(clones(params), o);
  set_grads(1, fused.params(), foreach.params());
  fused.step();
  foreach.step();
  const auto a = fused.state();
  const auto b = foreach.state();
  REQUIRE(a.size() == b.size());
  for (const auto& [key, value] : a) {
    INFO(key);
    REQUIRE(b.count(key) == 1);
    CHECK(value.sizes() == b.at(key).sizes());
    CHECK(value.scalar_type() == b.at(key).scalar_type());
  }
  // A state written by one continues in the other.
  foreach.load_state(a);
  CHECK(foreach.state().at("param.4.exp_avg").equal(a.at("param.4.exp_avg")));
}
