// The learning-rate schedules against their closed forms.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "support/error_message.h"
#include "hetseq/optim.h"

using hetseq::optim::Fixed;
using hetseq::test::require_throws_naming;
using hetseq::optim::FixedOptions;
using hetseq::optim::InverseSqrt;
using hetseq::optim::InverseSqrtOptions;
using hetseq::optim::PolynomialDecay;
using hetseq::optim::PolynomialDecayOptions;
using hetseq::optim::Sgd;
using hetseq::optim::SgdOptions;

namespace {

/// An optimizer whose lr the schedules drive.
struct Fixture {
  torch::Tensor param = torch::zeros({2}, torch::kFloat64).requires_grad_(true);
  Sgd sgd{{param}, SgdOptions{/*lr=*/123.0}};
};

}  // namespace

TEST_CASE("polynomial_decay warms up and decays as HetSeq does", "[lr]") {
  for (double power : {1.0, 2.0}) {
    DYNAMIC_SECTION("power " << power) {
      Fixture f;
      PolynomialDecayOptions o;
      o.lrs = {1e-3};
      o.warmup_updates = 10;
      o.total_num_update = 100;
      o.end_learning_rate = 1e-5;
      o.power = power;
      PolynomialDecay sched(f.sgd, o);
      CHECK(sched.name() == "PolynomialDecayScheduler");
      CHECK(f.sgd.lr() == Approx(1e-4));  // warmup factor 1/10 from the start

      const auto decayed = [&](int64_t n) {
        const double pct_remaining = 1.0 - static_cast<double>(n - 10) / 90.0;
        return (1e-3 - 1e-5) * std::pow(pct_remaining, power) + 1e-5;
      };
      const std::map<int64_t, double> expected = {
          {0, 0.0},           {1, 1e-4},          {5, 5e-4},          {10, 1e-3},  {11, decayed(11)},
          {50, decayed(50)},  {99, decayed(99)},  {100, 1e-5},        {150, 1e-5},
      };
      for (const auto& [n, lr] : expected) {
        INFO("num_updates " << n);
        CHECK(sched.step_update(n) == Approx(lr).margin(1e-15));
        CHECK(f.sgd.lr() == Approx(lr).margin(1e-15));
      }
      CHECK(decayed(50) == Approx(1e-5 + (1e-3 - 1e-5) * std::pow(50.0 / 90.0, power)));
    }
  }
}

TEST_CASE("polynomial_decay reads the --lr list at lrs[epoch]", "[lr]") {
  Fixture f;
  PolynomialDecayOptions o;
  o.lrs = {0.3, 0.2, 0.1};
  PolynomialDecay sched(f.sgd, o);
  CHECK(f.sgd.lr() == 0.3);       // epoch 1
  CHECK(sched.step(1) == 0.2);    // epoch 2
  CHECK(sched.step(2) == 0.1);    // epoch 3
  CHECK(sched.step(5) == 0.1);    // the last value holds
  CHECK(f.sgd.lr() == 0.1);
}

TEST_CASE("polynomial_decay scales the epoch's lr by the warmup factor", "[lr]") {
  Fixture f;
  PolynomialDecayOptions o;
  o.lrs = {1e-3, 5e-4};
  o.warmup_updates = 10;
  o.total_num_update = 100;
  PolynomialDecay sched(f.sgd, o);
  CHECK(sched.step_update(5) == Approx(5e-4));
  CHECK(sched.step(1) == Approx(0.5 * 5e-4));      // factor 5/10 times lrs[1]
  CHECK(sched.step_update(6) == Approx(0.6 * 5e-4));  // warmup continues from the new lr_
}

TEST_CASE("polynomial_decay with --force-anneal keeps the optimizer's lr", "[lr]") {
  Fixture f;
  PolynomialDecayOptions o;
  o.lrs = {0.4, 0.2, 0.05};
  o.force_anneal = 2;
  o.total_num_update = 100;
  o.end_learning_rate = 0;
  PolynomialDecay sched(f.sgd, o);
  CHECK(sched.step(1) == 0.2);                      // 1 < force_anneal: lrs[1]
  CHECK(sched.step_update(50) == Approx(0.1));      // 0.2 * (1 - 50/100)
  CHECK(sched.step(2) == Approx(0.1));              // annealing: lr_ = the optimizer's lr, not lrs[2]
  CHECK(sched.step_update(75) == Approx(0.025));    // decays from the new lr_: 0.1 * 0.25
  CHECK(sched.step(3) == Approx(0.025));
}

TEST_CASE("polynomial_decay records the best validation loss and round-trips its state", "[lr]") {
  Fixture f;
  PolynomialDecayOptions o;
  o.lrs = {1e-3, 5e-4};
  o.warmup_updates = 10;
  o.total_num_update = 100;
  PolynomialDecay a(f.sgd, o);
  CHECK_FALSE(a.best().has_value());
  CHECK(a.state().count("best") == 0);
  a.step_update(4);
  a.step(1, 3.0);
  a.step(2, 2.0);
  a.step(3, 2.5);
  a.step(4);
  CHECK(a.best() == 2.0);
  const auto state = a.state();
  CHECK(state.at("best") == 2.0);
  CHECK(state.at("lr") == 5e-4);
  CHECK(state.at("warmup_factor") == Approx(0.4));

  Fixture g;
  PolynomialDecay b(g.sgd, o);
  b.load_state(state);
  CHECK(b.best() == 2.0);
  CHECK(b.state() == state);
  CHECK(b.step(5) == a.step(5));
  CHECK(b.step_update(7) == a.step_update(7));

  auto unknown = state;
  unknown["decay"] = 1.0;
  require_throws_naming<hetseq::InputError>([&] { b.load_state(unknown); }, "'decay'");
  auto missing = state;
  missing.erase("warmup_factor");
  require_throws_naming<hetseq::InputError>([&] { b.load_state(missing); }, "'warmup_factor'");
}

TEST_CASE("polynomial_decay options are validated with the flag in the message", "[lr]") {
  Fixture f;
  PolynomialDecayOptions o;
  o.lrs = {1e-3};
  o.warmup_updates = 100;
  o.total_num_update = 100;
  require_throws_naming<hetseq::UsageError>([&] { PolynomialDecay s(f.sgd, o); }, "--total-num-update");
  require_throws_naming<hetseq::UsageError>([&] { PolynomialDecay s(f.sgd, o); }, "--warmup-updates");
  o.total_num_update = 1000;
  o.power = 0;
  require_throws_naming<hetseq::UsageError>([&] { PolynomialDecay s(f.sgd, o); }, "--power");
  o.power = 1;
  o.lrs = {};
  require_throws_naming<hetseq::UsageError>([&] { PolynomialDecay s(f.sgd, o); }, "--lr");
  o.lrs = {1e-3};
  o.end_learning_rate = -1;
  require_throws_naming<hetseq::UsageError>([&] { PolynomialDecay s(f.sgd, o); }, "--end-learning-rate");
  o.end_learning_rate = 0;
  o.force_anneal = 0;
  require_throws_naming<hetseq::UsageError>([&] { PolynomialDecay s(f.sgd, o); }, "--force-anneal");
}

TEST_CASE("fixed gives epoch k the entry lrs[k-1] and anneals by --lr-shrink", "[lr]") {
  Fixture f;
  FixedOptions o;
  o.lrs = {0.3, 0.2, 0.1};
  SECTION("list") {
    Fixed sched(f.sgd, o);
    CHECK(sched.name() == "fixed");
    CHECK(f.sgd.lr() == 0.3);      // epoch 1
    CHECK(sched.step(1) == 0.2);   // end of epoch 1: epoch 2's lr
    CHECK(sched.step(2) == 0.1);   // epoch 3
    CHECK(sched.step(7) == 0.1);   // the last entry holds
    CHECK(sched.step_update(1000) == 0.1);  // no warmup: the epoch's lr
  }
  SECTION("force_anneal") {
    o.force_anneal = 3;
    o.lr_shrink = 0.5;
    Fixed sched(f.sgd, o);
    CHECK(sched.step(1) == 0.2);                                 // epoch 2 < 3: the list
    CHECK(sched.step(2) == Approx(0.1 * 0.5));                   // epoch 3: 0.1 * 0.5^(3+1-3)
    CHECK(sched.step(3) == Approx(0.1 * 0.25));                  // epoch 4
    CHECK(sched.step(5) == Approx(0.1 * std::pow(0.5, 4)));      // epoch 6
  }
}

TEST_CASE("fixed warms up linearly over --warmup-updates", "[lr]") {
  Fixture f;
  FixedOptions o;
  o.lrs = {0.3, 0.2};
  o.warmup_updates = 4;
  Fixed sched(f.sgd, o);
  CHECK(f.sgd.lr() == Approx(0.3 / 4));
  CHECK(sched.step_update(0) == Approx(0.3 * 1 / 4));
  CHECK(sched.step_update(1) == Approx(0.3 * 2 / 4));
  CHECK(sched.step(1) == Approx(0.2 * 2 / 4));  // epoch 2's lr, still scaled by the warmup factor
  CHECK(sched.step_update(2) == Approx(0.2 * 3 / 4));
  CHECK(sched.step_update(3) == Approx(0.2));
  CHECK(sched.step_update(4) == Approx(0.2));
  CHECK(sched.step_update(10) == Approx(0.2));
  CHECK(sched.state().at("warmup_factor") == 1.0);

  SECTION("resuming past the warmup uses the full lr") {
    Fixture g;
    Fixed resumed(g.sgd, o);
    CHECK(resumed.step_update(100) == Approx(0.3));
    CHECK(resumed.step(2) == Approx(0.2));
  }
}

TEST_CASE("fixed round-trips its state and validates its options", "[lr]") {
  Fixture f;
  FixedOptions o;
  o.lrs = {0.3, 0.2};
  o.warmup_updates = 4;
  Fixed a(f.sgd, o);
  a.step_update(1);
  a.step(2, 1.5);
  Fixture g;
  Fixed b(g.sgd, o);
  b.load_state(a.state());
  CHECK(b.state() == a.state());
  CHECK(b.step(3) == a.step(3));

  FixedOptions bad = o;
  bad.lr_shrink = -0.1;
  require_throws_naming<hetseq::UsageError>([&] { Fixed s(f.sgd, bad); }, "--lr-shrink");
  bad = o;
  bad.lrs = {};
  require_throws_naming<hetseq::UsageError>([&] { Fixed s(f.sgd, bad); }, "--lr");
  bad = o;
  bad.warmup_updates = -1;
  require_throws_naming<hetseq::UsageError>([&] { Fixed s(f.sgd, bad); }, "--warmup-updates");
}

TEST_CASE("inverse_sqrt warms up from --warmup-init-lr, then decays as 1/sqrt(n)", "[lr]") {
  Fixture f;
  InverseSqrtOptions o;
  o.lrs = {1e-3};
  o.warmup_updates = 100;
  SECTION("explicit warmup_init_lr") {
    o.warmup_init_lr = 1e-5;
    InverseSqrt sched(f.sgd, o);
    CHECK(sched.name() == "inverse_sqrt");
    CHECK(f.sgd.lr() == 1e-5);
    CHECK(sched.step_update(0) == Approx(1e-5));
    CHECK(sched.step_update(50) == Approx(1e-5 + 50 * (1e-3 - 1e-5) / 100));
    CHECK(sched.step_update(99) == Approx(1e-5 + 99 * (1e-3 - 1e-5) / 100));
    CHECK(sched.step_update(100) == Approx(1e-3));
    CHECK(sched.step_update(400) == Approx(1e-3 * 10 / 20));
    CHECK(sched.step_update(10000) == Approx(1e-4));
    // step(epoch) only records the validation loss.
    CHECK(sched.step(1, 4.0) == Approx(1e-4));
    CHECK(sched.best() == 4.0);
    CHECK(f.sgd.lr() == Approx(1e-4));
  }
  SECTION("default warmup_init_lr is 0") {
    InverseSqrt sched(f.sgd, o);
    CHECK(f.sgd.lr() == 0.0);
    CHECK(sched.step_update(0) == 0.0);
    CHECK(sched.step_update(25) == Approx(2.5e-4));
    CHECK(sched.step_update(100) == Approx(1e-3));
  }
}

TEST_CASE("inverse_sqrt options are validated with the flag in the message", "[lr]") {
  Fixture f;
  InverseSqrtOptions o;
  o.lrs = {1e-3, 5e-4};
  require_throws_naming<hetseq::UsageError>([&] { InverseSqrt s(f.sgd, o); }, "--lr");
  o.lrs = {};
  require_throws_naming<hetseq::UsageError>([&] { InverseSqrt s(f.sgd, o); }, "--lr");
  o.lrs = {1e-3};
  o.warmup_updates = 0;
  require_throws_naming<hetseq::UsageError>([&] { InverseSqrt s(f.sgd, o); }, "--warmup-updates");
  o.warmup_updates = 10;
  o.warmup_init_lr = -1;
  require_throws_naming<hetseq::UsageError>([&] { InverseSqrt s(f.sgd, o); }, "--warmup-init-lr");
}
