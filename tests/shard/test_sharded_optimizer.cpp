// --zero-sharding os: the shard plan, and the sharded step against the unsharded one with ranks as
// threads over real Gloo groups (level 1 of STYLE's test levels; see support/rank_threads.h). See Note
// [Sharded optimizer state].
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/optim.h"
#include "hetseq/shard/shard_gather.h"
#include "hetseq/shard/shard_plan.h"
#include "hetseq/shard/sharded_optimizer.h"
#include "hetseq/shard/zero_sharding.h"
#include "cuda/cuda_skip.h"
#include "support/rank_threads.h"
#include "support/sharded_state.h"

using hetseq::GatherMethod;
using hetseq::plan_shards;
using hetseq::shard_slices;
using hetseq::ShardedOptimizer;
using hetseq::ShardedOptimizerOptions;
using hetseq::ShardRange;
using hetseq::ShardReport;
using hetseq::optim::Optimizer;
using hetseq::optim::OptimizerFactory;

namespace {

using hetseq::test::Group;
using hetseq::test::OneIntraOpThread;
using hetseq::test::run_ranks;

// Parameters of 91, 13, 50 and 60 elements (214 in all): with budgets 1:1:2 the first and the third
// straddle two ranks.
// (Closed forms, not the global generator, which the rank threads would share.)
std::vector<torch::Tensor> shaped(double scale, double phase, const torch::Device& device) {
  std::vector<torch::Tensor> out;
  const std::vector<std::vector<int64_t>> shapes{{7, 13}, {13}, {50}, {3, 5, 4}};
  for (size_t k = 0; k < shapes.size(); ++k) {
    const int64_t n = c10::multiply_integers(shapes[k]);
    const torch::Tensor x = torch::arange(n, torch::kFloat32) * scale + phase + static_cast<double>(k);
    out.push_back(torch::sin(x).view(shapes[k]).to(device));
  }
  return out;
}

std::vector<torch::Tensor> make_params(const torch::Device& device) { return shaped(0.37, 0.5, device); }

// The reduced gradients of update t: the same on every rank, as after the reducer's allreduce.
std::vector<torch::Tensor> make_grads(int t, const torch::Device& device) {
  return shaped(0.11 * (t + 1), 0.3 * t, device);
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.clone());
  return out;
}

// Sets the gradients, clipped to norm 1 as the Controller clips the reduced ones (--clip-norm 1).
void set_grads(std::vector<torch::Tensor>& params, int t) {
  auto grads = make_grads(t, params.front().device());
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
  torch::nn::utils::clip_grad_norm_(params, 1.0);
}

constexpr int kSteps = 6;

using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // [rank] (first, numel)

Ranges ranges(const std::vector<ShardRange>& plan) {
  Ranges out;
  for (const auto& r : plan) out.emplace_back(r.first, r.numel);
  return out;
}

// The unsharded optimizer's parameters after kSteps updates (the lr changes at each, as a schedule would).
std::vector<torch::Tensor> reference(const OptimizerFactory& make, const torch::Device& device = torch::kCPU) {
  auto params = make_params(device);
  auto optimizer = make(params);
  for (int t = 0; t < kSteps; ++t) {
    set_grads(params, t);
    optimizer->set_lr(optimizer->lr() * 0.9);
    optimizer->step();
  }
  return params;
}

struct RankResult {
  std::vector<torch::Tensor> params;
  std::vector<ShardReport> reports;
  int64_t state_bytes = 0;
};

std::vector<RankResult> sharded(const OptimizerFactory& make, std::vector<int64_t> budgets, int64_t alignment,
                                GatherMethod method, const torch::Device& device = torch::kCPU) {
  OneIntraOpThread one_thread;
  std::vector<RankResult> results(budgets.size());
  run_ranks(static_cast<int>(budgets.size()), [&](int rank, const Group& group) {
    auto params = make_params(device);
    ShardedOptimizerOptions options;
    options.budget_bytes = budgets[static_cast<size_t>(rank)];
    options.alignment = alignment;
    options.gather = method;
    RankResult& out = results[static_cast<size_t>(rank)];
    auto optimizer = ShardedOptimizer::create(params, make, group, options,
                                              [&](const std::vector<ShardReport>& r) { out.reports = r; });
    for (int t = 0; t < kSteps; ++t) {
      set_grads(params, t);
      optimizer->set_lr(optimizer->lr() * 0.9);
      optimizer->step();
    }
    out.params = params;
    out.state_bytes = optimizer->state_bytes();
  });
  return results;
}

OptimizerFactory adam(bool fused) {
  return [fused](std::vector<torch::Tensor> p) -> std::unique_ptr<Optimizer> {
    hetseq::optim::AdamOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.1;
    o.fused = fused;
    return std::make_unique<hetseq::optim::Adam>(std::move(p), o);
  };
}

OptimizerFactory sgd() {
  return [](std::vector<torch::Tensor> p) -> std::unique_ptr<Optimizer> {
    hetseq::optim::SgdOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.weight_decay = 0.01;
    return std::make_unique<hetseq::optim::Sgd>(std::move(p), o);
  };
}

OptimizerFactory adadelta() {
  return [](std::vector<torch::Tensor> p) -> std::unique_ptr<Optimizer> {
    hetseq::optim::AdadeltaOptions o;
    o.weight_decay = 0.01;
    return std::make_unique<hetseq::optim::Adadelta>(std::move(p), o);
  };
}

}  // namespace

TEST_CASE("plan_shards cuts the flat space in proportion to the budgets, aligned, covering it exactly",
          "[zero_shard]") {
  // 1000 elements are 63 units of 16; boundaries at round(63/4) = 16 and round(63/2) = 32 units.
  CHECK(ranges(plan_shards({1, 1, 2}, 1000, 16)) == Ranges{{0, 256}, {256, 256}, {512, 488}});
  CHECK(ranges(plan_shards({1 << 30, 1 << 30, 2LL << 30}, 1000, 16)) == ranges(plan_shards({1, 1, 2}, 1000, 16)));
  CHECK(ranges(plan_shards({1, 1, 2}, 214, 1)) == Ranges{{0, 54}, {54, 53}, {107, 107}});
  CHECK(ranges(plan_shards({5}, 214, 16)) == Ranges{{0, 214}});
  CHECK(ranges(plan_shards({3, 1}, 1600, 16)) == Ranges{{0, 1200}, {1200, 400}});
  // Exact cover and within one alignment of the share, for budgets of 12 GB beside 48 GB.
  const std::vector<int64_t> budgets{12LL << 30, 48LL << 30, 24LL << 30, 1LL << 30};
  const int64_t total = 10000019;
  const auto plan = plan_shards(budgets, total, 16);
  int64_t next = 0;
  for (size_t r = 0; r < plan.size(); ++r) {
    CHECK(plan[r].first == next);
    next += plan[r].numel;
    const double share = static_cast<double>(total) * static_cast<double>(budgets[r]) / (85.0 * (1LL << 30));
    CHECK(std::abs(static_cast<double>(plan[r].numel) - share) <= 16);
  }
  CHECK(next == total);
}

TEST_CASE("plan_shards refuses a budget that is not positive or too small for a shard", "[zero_shard]") {
  CHECK_THROWS_AS(plan_shards({1, 0, 2}, 1000, 16), hetseq::InputError);
  CHECK_THROWS_AS(plan_shards({1, 1000000}, 100, 16), hetseq::InputError);
  CHECK_THROWS_WITH(plan_shards({1, 0, 2}, 1000, 16),
                    Catch::Matchers::Contains("--memory-budget: rank 1 has a budget of 0 bytes"));
  CHECK_THROWS_WITH(plan_shards({1, 1000000}, 100, 16),
                    Catch::Matchers::Contains("--memory-budget: rank 0's budget (1 bytes of 1000001 in all) is too "
                                                 "small a share for one 16-element piece of the 100 parameters"));
}

TEST_CASE("shard_slices lists the parts of the parameters in a range, straddling ones included", "[zero_shard]") {
  const auto s = shard_slices({10, 20, 5}, ShardRange{8, 15});
  REQUIRE(s.size() == 2);
  CHECK((s[0].param == 0 && s[0].offset == 8 && s[0].numel == 2));
  CHECK((s[1].param == 1 && s[1].offset == 0 && s[1].numel == 13));
  CHECK(shard_slices({10, 20, 5}, ShardRange{30, 5}).size() == 1);
}

TEST_CASE("parse_zero_sharding names the flag on a bad value", "[zero_shard]") {
  CHECK(hetseq::parse_zero_sharding("none") == hetseq::ZeroSharding::kNone);
  CHECK(hetseq::parse_zero_sharding("os") == hetseq::ZeroSharding::kOptimizerState);
  CHECK(hetseq::parse_zero_sharding("os+grad") == hetseq::ZeroSharding::kGradients);
  CHECK(hetseq::parse_zero_sharding("full") == hetseq::ZeroSharding::kFull);
  for (const char* mode : {"none", "os", "os+grad", "full"}) {
    CHECK(hetseq::to_string(hetseq::parse_zero_sharding(mode)) == mode);
  }
  CHECK_THROWS_AS(hetseq::parse_zero_sharding("grad"), hetseq::UsageError);
  CHECK_THROWS_WITH(hetseq::parse_zero_sharding("grad"),
                    Catch::Matchers::Equals("--zero-sharding: 'grad' is not one of none, os, os+grad, full"));
}

TEST_CASE("A sharded step equals the unsharded one bit for bit, tensors straddling ranks", "[zero_shard]") {
  struct Case {
    std::string name;
    OptimizerFactory make;
    int buffers;  // state tensors of the parameters' size
  };
  const std::vector<Case> cases{{"adam (fused)", adam(true), 2},
                                {"adam (foreach)", adam(false), 2},
                                {"sgd momentum", sgd(), 1},
                                {"adadelta", adadelta(), 2}};
  for (const auto& c : cases) {
    for (const int64_t alignment : {16, 1}) {
      for (const auto method : {GatherMethod::kAllgatherPadded, GatherMethod::kBroadcastPerRank}) {
        INFO(c.name << ", alignment " << alignment << ", "
                    << (method == GatherMethod::kAllgatherPadded ? "allgather" : "broadcast"));
        const auto expected = reference(c.make);
        const auto results = sharded(c.make, {1, 1, 2}, alignment, method);
        const auto plan = plan_shards({1, 1, 2}, 214, alignment);
        for (size_t r = 0; r < results.size(); ++r) {
          INFO("rank " << r);
          for (size_t i = 0; i < expected.size(); ++i) {
            INFO("parameter " << i);
            CHECK(torch::equal(results[r].params[i], expected[i]));
          }
          CHECK(results[r].state_bytes == c.buffers * plan[r].numel * 4);
          REQUIRE(results[r].reports.size() == 3);
          for (size_t q = 0; q < 3; ++q) {
            CHECK(results[r].reports[q].rank == static_cast<int64_t>(q));
            CHECK(results[r].reports[q].first == plan[q].first);
            CHECK(results[r].reports[q].numel == plan[q].numel);
            CHECK(results[r].reports[q].state_bytes == c.buffers * plan[q].numel * 4);
            CHECK(results[r].reports[q].budget_bytes == std::vector<int64_t>{1, 1, 2}[q]);
          }
        }
      }
    }
  }
}

namespace {

// Every entry of two optimizer states, equal in name and bits.
bool same_state(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    const auto it = b.find(k);
    if (it == b.end() || !torch::equal(v.to(torch::kFloat64), it->second.to(torch::kFloat64))) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("A sharded optimizer's gathered state is the unsharded one, and resumes on other ranks and budgets",
          "[zero_shard]") {
  OneIntraOpThread one_thread;
  const auto make = adam(true);
  // The uninterrupted unsharded run: kSteps updates, its state after 3 of them.
  auto params = make_params(torch::kCPU);
  auto plain = make(params);
  std::map<std::string, torch::Tensor> at3;
  for (int t = 0; t < kSteps; ++t) {
    if (t == 3) {
      for (const auto& [k, v] : plain->state()) at3[k] = v.clone();
    }
    set_grads(params, t);
    plain->step();
  }
  const auto expected = params;

  // 3 ranks, budgets 1:1:2: 3 updates, then the gathered state on every rank.
  std::vector<std::map<std::string, torch::Tensor>> saved(3);
  std::vector<std::vector<torch::Tensor>> saved_params(3);
  run_ranks(3, [&](int rank, const Group& group) {
    auto p = make_params(torch::kCPU);
    ShardedOptimizerOptions options;
    options.budget_bytes = std::vector<int64_t>{1, 1, 2}[static_cast<size_t>(rank)];
    auto optimizer = ShardedOptimizer::create(p, make, group, options);
    for (int t = 0; t < 3; ++t) {
      set_grads(p, t);
      optimizer->step();
    }
    for (const auto& [k, v] : hetseq::test::gather_sharded_state(*optimizer, group)) {
      saved[static_cast<size_t>(rank)][k] = v.clone();
    }
    saved_params[static_cast<size_t>(rank)] = clones(p);
  });
  for (size_t r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(same_state(saved[r], at3));
  }

  // Resumed on 2 ranks with budgets 1:3, and unsharded on one: the last 3 updates.
  std::vector<std::vector<torch::Tensor>> resumed(2);
  run_ranks(2, [&](int rank, const Group& group) {
    auto p = clones(saved_params[0]);
    ShardedOptimizerOptions options;
    options.budget_bytes = rank == 0 ? 1 : 3;
    auto optimizer = ShardedOptimizer::create(p, make, group, options);
    optimizer->load_state(saved[0]);
    for (int t = 3; t < kSteps; ++t) {
      set_grads(p, t);
      optimizer->step();
    }
    resumed[static_cast<size_t>(rank)] = p;
  });
  auto p = clones(saved_params[0]);
  auto unsharded = make(p);
  unsharded->load_state(saved[0]);
  for (int t = 3; t < kSteps; ++t) {
    set_grads(p, t);
    unsharded->step();
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("parameter " << i);
    CHECK(torch::equal(resumed[0][i], expected[i]));
    CHECK(torch::equal(resumed[1][i], expected[i]));
    CHECK(torch::equal(p[i], expected[i]));
  }
}

// The same claim with the parameters, gradients and optimizer state on GPU 0 (the ranks as threads share it,
// over Gloo with CUDA tensors): LibTorch's CUDA kernels (fused Adam, the foreach ops) on slices that start
// anywhere must update each element as on the whole tensor.
TEST_CASE("CUDA: a sharded step on CUDA parameters equals the unsharded one bit for bit, tensors straddling ranks",
          "[cuda][zero_shard]") {
  if (!hetseq::test::cuda_or_skip()) return;
  const torch::Device cuda(torch::kCUDA, 0);
  const std::vector<std::pair<std::string, OptimizerFactory>> cases{
      {"adam (fused)", adam(true)}, {"adam (foreach)", adam(false)}, {"sgd momentum", sgd()}, {"adadelta", adadelta()}};
  for (const auto& [name, make] : cases) {
    for (const int64_t alignment : {16, 1}) {
      INFO(name << ", alignment " << alignment);
      const auto expected = reference(make, cuda);
      const auto results = sharded(make, {1, 1, 2}, alignment, GatherMethod::kBroadcastPerRank, cuda);
      for (size_t r = 0; r < results.size(); ++r) {
        INFO("rank " << r);
        for (size_t i = 0; i < expected.size(); ++i) {
          INFO("parameter " << i);
          REQUIRE(results[r].params[i].is_cuda());
          CHECK(torch::equal(results[r].params[i], expected[i]));
        }
      }
    }
  }
}
