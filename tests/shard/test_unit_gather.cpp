// --zero-sharding full's UnitGather with ranks as threads (level 1 of STYLE's test levels): a unit's
// parameters exist only around its passes, and the gradients are those of the plain model. See Note [Sharded
// parameters].
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/shard/shard_plan.h"
#include "hetseq/shard/unit_gather.h"
#include "hetseq/task/model_units.h"
#include "support/rank_threads.h"

using hetseq::test::Group;
using hetseq::test::OneIntraOpThread;
using hetseq::test::run_ranks;

namespace {

// Two units (a, b) and a root layer (c).
struct GatherNet : torch::nn::Module, hetseq::ShardableModel {
  GatherNet() {
    torch::manual_seed(7);
    a = register_module("a", torch::nn::Linear(6, 5));
    b = register_module("b", torch::nn::Linear(5, 4));
    c = register_module("c", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::tanh(hetseq::run_unit(runner, 0, [&] { return a->forward(x); }));
    h = torch::tanh(hetseq::run_unit(runner, 1, [&] { return b->forward(h); }));
    return c->forward(h);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() override { return {a.ptr(), b.ptr()}; }
  void set_unit_runner(std::shared_ptr<hetseq::UnitRunner> r) override { runner = std::move(r); }

  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
  std::shared_ptr<hetseq::UnitRunner> runner;
};

struct RankSeen {
  std::vector<int64_t> unit_bytes_at_start;  // [param] its storage's bytes once sharded
  int64_t held_bytes = 0;
  std::vector<int64_t> unit_bytes_in_backward;  // unit a's storage bytes when c's gradient is computed
  std::vector<int64_t> unit_bytes_after;        // [param] after backward
  std::vector<torch::Tensor> grads;             // [param]
  std::vector<torch::Tensor> whole;             // whole_parameters(true)
  std::string order_error;
};

}  // namespace

TEST_CASE("UnitGather: a unit's parameters exist only around its passes, the gradients are the plain model's, and "
          "units out of order are refused",
          "[zero_shard]") {
  OneIntraOpThread one_thread;
  const torch::Tensor x = torch::linspace(-1, 1, 18).reshape({3, 6});
  GatherNet plain;
  plain.forward(x).square().sum().backward();
  std::vector<torch::Tensor> expected_grads, expected_params;
  for (const auto& p : plain.parameters()) {
    expected_grads.push_back(p.grad().clone());
    expected_params.push_back(p.detach().clone());
  }
  const int64_t total = 6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3;  // 74
  const auto plan = hetseq::plan_shards({1, 2}, total, 4);

  std::vector<RankSeen> seen(2);
  std::vector<std::shared_ptr<GatherNet>> nets{std::make_shared<GatherNet>(), std::make_shared<GatherNet>()};  // the generator here
  run_ranks(2, [&](int rank, const Group& group) {
    RankSeen& s = seen[static_cast<size_t>(rank)];
    GatherNet& net = *nets[static_cast<size_t>(rank)];
    auto params = net.parameters();
    auto units = std::make_shared<hetseq::UnitGather>(params, hetseq::parameter_units(net), plan, group);
    net.set_unit_runner(units);
    for (const auto& p : params) s.unit_bytes_at_start.push_back(static_cast<int64_t>(p.storage().nbytes()));
    s.held_bytes = units->held_bytes();
    // When c's input gradient is computed, unit b's backward has not run yet: a hook on c's output sees a freed.
    torch::Tensor out = net.forward(x);
    out.register_hook([&](const torch::Tensor&) {
      s.unit_bytes_in_backward.push_back(static_cast<int64_t>(net.a->weight.storage().nbytes()));
    });
    out.square().sum().backward();
    for (const auto& p : params) {
      s.unit_bytes_after.push_back(static_cast<int64_t>(p.storage().nbytes()));
      s.grads.push_back(p.grad().clone());
    }
    s.whole = units->whole_parameters(true);
    try {
      units->run(1, [&] { return net.b->forward(torch::zeros({1, 5})); });
    } catch (const hetseq::InternalError& e) {
      s.order_error = e.what();
    }
  });

  for (size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const RankSeen& s = seen[r];
    // Parameters 0-3 (a, b: the units) have no storage between passes; 4-5 (c: the root) are whole.
    REQUIRE(s.unit_bytes_at_start.size() == 6);
    for (size_t p = 0; p < 4; ++p) CHECK(s.unit_bytes_at_start[p] == 0);
    CHECK(s.unit_bytes_at_start[4] == 4 * (12 + 3));
    CHECK(s.held_bytes == 4 * (plan[r].numel + 12 + 3));
    REQUIRE(s.unit_bytes_in_backward.size() == 1);
    CHECK(s.unit_bytes_in_backward[0] == 0);  // a is gathered again only when its own backward comes
    for (size_t p = 0; p < 4; ++p) CHECK(s.unit_bytes_after[p] == 0);
    for (size_t p = 0; p < 6; ++p) {
      INFO("parameter " << p);
      CHECK(torch::equal(s.grads[p], expected_grads[p]));
      CHECK(torch::equal(s.whole[p], expected_params[p]));
    }
    CHECK(s.order_error ==
          "--zero-sharding full: the model ran unit 1 first of its 2 units; a model runs its units in index order, "
          "each once a forward pass (ShardableModel::units())");
  }
}
