// Adam, Adadelta and SGD against their update formulas evaluated with plain doubles, and the
// checkpoint form of their state.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "support/error_message.h"
#include "hetseq/optim.h"

using hetseq::optim::Adadelta;
using hetseq::test::require_throws_naming;
using hetseq::optim::AdadeltaOptions;
using hetseq::optim::Adam;
using hetseq::optim::AdamOptions;
using hetseq::optim::Sgd;
using hetseq::optim::SgdOptions;

namespace {

using Vec = std::vector<double>;

torch::Tensor make_param(const Vec& values) {
  return torch::tensor(values, torch::kFloat64).requires_grad_(true);
}

void set_grad(torch::Tensor& p, const Vec& values) { p.mutable_grad() = torch::tensor(values, torch::kFloat64); }

void require_close(const torch::Tensor& actual, const Vec& expected) {
  const auto a = actual.detach().to(torch::kFloat64).contiguous();
  REQUIRE(static_cast<size_t>(a.numel()) == expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    CHECK(a[static_cast<int64_t>(k)].item<double>() == Approx(expected[k]).epsilon(1e-12).margin(1e-15));
  }
}

/// fairseq's Adam on plain doubles; t is the parameter's 1-based update count.
struct AdamRef {
  AdamOptions o;
  Vec m, v;
  void step(Vec& p, const Vec& g, int t) {
    if (m.empty()) m = v = Vec(p.size(), 0.0);
    const double bc1 = 1 - std::pow(o.beta1, t);
    const double bc2 = 1 - std::pow(o.beta2, t);
    const double step_size = o.lr * std::sqrt(bc2) / bc1;
    for (size_t k = 0; k < p.size(); ++k) {
      m[k] = o.beta1 * m[k] + (1 - o.beta1) * g[k];
      v[k] = o.beta2 * v[k] + (1 - o.beta2) * g[k] * g[k];
      const double denom = std::sqrt(v[k]) + o.eps;
      if (o.weight_decay != 0) p[k] = p[k] - o.weight_decay * o.lr * p[k];
      p[k] = p[k] - step_size * m[k] / denom;
    }
  }
};

/// torch.optim.Adadelta on plain doubles.
struct AdadeltaRef {
  AdadeltaOptions o;
  Vec sq, acc;
  void step(Vec& p, Vec g) {
    if (sq.empty()) sq = acc = Vec(p.size(), 0.0);
    for (size_t k = 0; k < p.size(); ++k) {
      if (o.weight_decay != 0) g[k] += o.weight_decay * p[k];
      sq[k] = o.rho * sq[k] + (1 - o.rho) * g[k] * g[k];
      const double std = std::sqrt(sq[k] + o.eps);
      const double delta = std::sqrt(acc[k] + o.eps) / std * g[k];
      p[k] -= o.lr * delta;
      acc[k] = o.rho * acc[k] + (1 - o.rho) * delta * delta;
    }
  }
};

const Vec kP0 = {0.5, -1.0, 2.0, 0.0};
const Vec kG1 = {0.1, -0.2, 0.3, 1.5};
const Vec kG2 = {-0.05, 0.4, 0.0, -2.0};
const Vec kG3 = {0.2, 0.1, -0.3, 0.7};

}  // namespace

TEST_CASE("Adam takes fairseq's steps", "[optim]") {
  for (double wd : {0.0, 0.01}) {
    DYNAMIC_SECTION("weight decay " << wd) {
      AdamOptions o;
      o.lr = 0.01;
      o.beta1 = 0.8;
      o.beta2 = 0.95;
      o.eps = 1e-6;
      o.weight_decay = wd;
      auto p = make_param(kP0);
      Adam adam({p}, o);
      CHECK(adam.name() == "adam");
      AdamRef ref{o, {}, {}};
      Vec expected = kP0;

      set_grad(p, kG1);
      adam.step();
      ref.step(expected, kG1, 1);
      require_close(p, expected);
      CHECK(adam.num_steps() == 1);

      set_grad(p, kG2);
      adam.step();
      ref.step(expected, kG2, 2);
      require_close(p, expected);
      CHECK(adam.num_steps() == 2);
    }
  }
}

TEST_CASE("Adam's bias correction counts each parameter's own updates", "[optim]") {
  AdamOptions o;
  o.lr = 0.1;
  auto a = make_param(kP0);
  auto b = make_param({3.0, -3.0});
  Adam adam({a, b}, o);
  AdamRef ref_a{o, {}, {}};
  AdamRef ref_b{o, {}, {}};
  Vec expected_a = kP0;
  Vec expected_b = {3.0, -3.0};

  set_grad(a, kG1);  // b has no grad: it is skipped and gets no state
  adam.step();
  ref_a.step(expected_a, kG1, 1);
  require_close(a, expected_a);
  require_close(b, expected_b);
  const auto state = adam.state();
  CHECK(state.count("param.0.exp_avg") == 1);
  CHECK(state.count("param.1.exp_avg") == 0);
  CHECK(state.count("param.1.step") == 0);

  set_grad(a, kG2);
  set_grad(b, {0.5, 0.25});
  adam.step();
  ref_a.step(expected_a, kG2, 2);
  ref_b.step(expected_b, {0.5, 0.25}, 1);  // b's first update: t = 1
  require_close(a, expected_a);
  require_close(b, expected_b);
  CHECK(adam.state().at("param.1.step").item<int64_t>() == 1);
  CHECK(adam.state().at("param.0.step").item<int64_t>() == 2);
}

TEST_CASE("Adam updates fp16 parameters through fp32 buffers", "[optim]") {
  auto p = torch::tensor({0.5, -1.0}, torch::kFloat64).to(torch::kHalf).requires_grad_(true);
  p.mutable_grad() = torch::tensor({0.25, -0.5}, torch::kFloat64).to(torch::kHalf);
  AdamOptions o;
  o.lr = 0.125;
  Adam adam({p}, o);
  adam.step();
  CHECK(p.scalar_type() == torch::kHalf);
  CHECK(adam.state().at("param.0.exp_avg").scalar_type() == torch::kFloat);
  // The first Adam step moves each element by about lr against the sign of its gradient.
  CHECK(p[0].item<double>() == Approx(0.375).epsilon(1e-3));
  CHECK(p[1].item<double>() == Approx(-0.875).epsilon(1e-3));
}

TEST_CASE("Adadelta takes torch's steps", "[optim]") {
  for (double wd : {0.0, 0.1}) {
    DYNAMIC_SECTION("weight decay " << wd) {
      AdadeltaOptions o;
      o.lr = 0.5;
      o.rho = 0.8;
      o.eps = 1e-4;
      o.weight_decay = wd;
      auto p = make_param(kP0);
      Adadelta adadelta({p}, o);
      CHECK(adadelta.name() == "adadelta");
      AdadeltaRef ref{o, {}, {}};
      Vec expected = kP0;

      set_grad(p, kG1);
      adadelta.step();
      ref.step(expected, kG1);
      require_close(p, expected);

      set_grad(p, kG2);
      adadelta.step();
      ref.step(expected, kG2);
      require_close(p, expected);
    }
  }
}

TEST_CASE("SGD with momentum takes torch's steps", "[optim]") {
  for (double wd : {0.0, 0.05}) {
    DYNAMIC_SECTION("weight decay " << wd) {
      SgdOptions o;
      o.lr = 0.1;
      o.momentum = 0.9;
      o.weight_decay = wd;
      auto p = make_param(kP0);
      Sgd sgd({p}, o);
      CHECK(sgd.name() == "sgd");

      Vec expected = kP0;
      Vec buf(kP0.size());
      set_grad(p, kG1);
      sgd.step();
      for (size_t k = 0; k < kP0.size(); ++k) {
        buf[k] = kG1[k] + wd * expected[k];  // first step: buf = g
        expected[k] -= o.lr * buf[k];
      }
      require_close(p, expected);

      set_grad(p, kG2);
      sgd.step();
      for (size_t k = 0; k < kP0.size(); ++k) {
        buf[k] = o.momentum * buf[k] + kG2[k] + wd * expected[k];
        expected[k] -= o.lr * buf[k];
      }
      require_close(p, expected);
    }
  }
}

TEST_CASE("SGD without momentum keeps no buffers", "[optim]") {
  SgdOptions o;
  o.lr = 0.5;
  auto p = make_param({1.0, 2.0});
  Sgd sgd({p}, o);
  set_grad(p, {0.5, -1.0});
  sgd.step();
  require_close(p, {0.75, 2.5});
  const auto state = sgd.state();
  CHECK(state.count("param.0.step") == 1);
  CHECK(state.count("param.0.momentum_buffer") == 0);
}

TEST_CASE("zero_grad zeroes or drops the gradients", "[optim]") {
  auto p = make_param({1.0, 2.0});
  SgdOptions o;
  o.lr = 0.1;
  Sgd sgd({p}, o);
  set_grad(p, {3.0, 4.0});
  const void* storage = p.grad().data_ptr();
  sgd.zero_grad();
  REQUIRE(p.grad().defined());
  CHECK(p.grad().data_ptr() == storage);
  require_close(p.grad(), {0.0, 0.0});
  sgd.zero_grad(/*set_to_none=*/true);
  CHECK_FALSE(p.grad().defined());
  sgd.step();  // no grad: nothing moves, the step still counts
  require_close(p, {1.0, 2.0});
  CHECK(sgd.num_steps() == 1);
}

TEST_CASE("set_lr changes the next step", "[optim]") {
  auto p = make_param({1.0});
  SgdOptions o;
  o.lr = 0.1;
  Sgd sgd({p}, o);
  sgd.set_lr(0.25);
  CHECK(sgd.lr() == 0.25);
  set_grad(p, {2.0});
  sgd.step();
  require_close(p, {0.5});
  CHECK_THROWS_AS(sgd.set_lr(-1.0), hetseq::InternalError);
}

namespace {

/// Steps `a` three times; a fresh optimizer made by `make` over a copy of a's parameters after two
/// steps, loaded with a's state, must take the same third step.
template <class Make>
void check_round_trip(Make make) {
  auto p = make_param(kP0);
  auto a = make(p);
  set_grad(p, kG1);
  a->step();
  a->set_lr(a->lr() * 0.5);
  set_grad(p, kG2);
  a->step();

  auto q = p.detach().clone().requires_grad_(true);
  auto b = make(q);
  // Checkpoints are written by value: serialize the state as a checkpoint would.
  std::map<std::string, torch::Tensor> saved;
  for (const auto& [key, value] : a->state()) saved[key] = value.clone();
  b->load_state(saved);
  CHECK(b->lr() == a->lr());
  CHECK(b->num_steps() == 2);

  set_grad(p, kG3);
  set_grad(q, kG3);
  a->step();
  b->step();
  CHECK(torch::equal(p, q));
  REQUIRE(a->state().size() == b->state().size());
  for (const auto& [key, value] : a->state()) CHECK(torch::equal(value, b->state().at(key)));
}

}  // namespace

TEST_CASE("Optimizer state round-trips through load_state", "[optim]") {
  SECTION("adam") {
    AdamOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.01;
    check_round_trip([&](torch::Tensor p) { return std::make_unique<Adam>(std::vector<torch::Tensor>{p}, o); });
  }
  SECTION("adadelta") {
    AdadeltaOptions o;
    o.weight_decay = 0.1;
    check_round_trip([&](torch::Tensor p) { return std::make_unique<Adadelta>(std::vector<torch::Tensor>{p}, o); });
  }
  SECTION("sgd") {
    SgdOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    check_round_trip([&](torch::Tensor p) { return std::make_unique<Sgd>(std::vector<torch::Tensor>{p}, o); });
  }
}

TEST_CASE("Optimizer load_state refuses a state of another model or optimizer", "[optim]") {
  auto p = make_param(kP0);
  Adam adam({p}, AdamOptions{});
  set_grad(p, kG1);
  adam.step();
  const auto state = adam.state();

  SECTION("shape mismatch") {
    auto q = make_param({1.0, 2.0, 3.0});
    Adam other({q}, AdamOptions{});
    require_throws_naming<hetseq::InputError>([&] { other.load_state(state); }, "param.0.exp_avg");
    CHECK(other.state().count("param.0.exp_avg") == 0);  // nothing was loaded
  }
  SECTION("different number of parameters") {
    auto q = make_param(kP0);
    auto r = make_param({1.0});
    Adam other({q, r}, AdamOptions{});
    require_throws_naming<hetseq::InputError>([&] { other.load_state(state); }, "parameters");
  }
  SECTION("another optimizer's buffers") {
    auto q = make_param(kP0);
    Adadelta other({q}, AdadeltaOptions{});
    require_throws_naming<hetseq::InputError>([&] { other.load_state(state); }, "param.0.exp_avg");
  }
  SECTION("a missing buffer") {
    auto partial = state;
    partial.erase("param.0.exp_avg_sq");
    auto q = make_param(kP0);
    Adam other({q}, AdamOptions{});
    require_throws_naming<hetseq::InputError>([&] { other.load_state(partial); }, "param.0.exp_avg_sq");
  }
  SECTION("a parameter index out of range") {
    auto extra = state;
    extra["param.7.step"] = torch::scalar_tensor(int64_t{1}, torch::kInt64);
    auto q = make_param(kP0);
    Adam other({q}, AdamOptions{});
    require_throws_naming<hetseq::InputError>([&] { other.load_state(extra); }, "param.7.step");
  }
  SECTION("a missing lr") {
    auto partial = state;
    partial.erase("lr");
    auto q = make_param(kP0);
    Adam other({q}, AdamOptions{});
    require_throws_naming<hetseq::InputError>([&] { other.load_state(partial); }, "'lr'");
  }
}

TEST_CASE("Optimizer options are validated with the flag in the message", "[optim]") {
  auto p = make_param({1.0});
  const auto adam = [&](AdamOptions o) { Adam a({p}, o); };
  AdamOptions o;
  o.beta2 = 1.0;
  require_throws_naming<hetseq::UsageError>([&] { adam(o); }, "--adam-betas");
  o = {};
  o.beta1 = -0.1;
  require_throws_naming<hetseq::UsageError>([&] { adam(o); }, "--adam-betas");
  o = {};
  o.eps = -1e-8;
  require_throws_naming<hetseq::UsageError>([&] { adam(o); }, "--adam-eps");
  o = {};
  o.weight_decay = -0.1;
  require_throws_naming<hetseq::UsageError>([&] { adam(o); }, "--weight-decay");
  o = {};
  o.lr = -1;
  require_throws_naming<hetseq::UsageError>([&] { adam(o); }, "--lr");

  const auto adadelta = [&](AdadeltaOptions o) { Adadelta a({p}, o); };
  AdadeltaOptions d;
  d.rho = 1.5;
  require_throws_naming<hetseq::UsageError>([&] { adadelta(d); }, "--adadelta_rho");
  d = {};
  d.eps = -1;
  require_throws_naming<hetseq::UsageError>([&] { adadelta(d); }, "--adadelta_eps");
  d = {};
  d.weight_decay = -1;
  require_throws_naming<hetseq::UsageError>([&] { adadelta(d); }, "--adadelta_weight_decay");

  const auto sgd = [&](SgdOptions o) { Sgd s({p}, o); };
  SgdOptions s;
  s.lr = 0.1;
  s.momentum = -0.5;
  require_throws_naming<hetseq::UsageError>([&] { sgd(s); }, "--momentum");
  s.momentum = 0;
  s.weight_decay = -1;
  require_throws_naming<hetseq::UsageError>([&] { sgd(s); }, "--weight-decay");

  require_throws_naming<hetseq::InputError>([&] { Sgd empty({}, SgdOptions{}); }, "no parameters");
}
