// The split math of balancing (Note [Balancing]), level 1: no processes, exact expected splits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "hetseq/balance/split_solver.h"
#include "hetseq/data/data_plan.h"
#include "hetseq/core/error.h"
#include "support/error_message.h"

using hetseq::RankCost;
using hetseq::SplitProblem;

namespace {

SplitProblem problem(int64_t total, std::vector<RankCost> costs, std::vector<int64_t> caps = {}, int64_t multiple = 1) {
  SplitProblem p;
  p.samples_per_update = total;
  p.caps = caps.empty() ? std::vector<int64_t>(costs.size(), 0) : caps;
  p.costs = std::move(costs);
  p.multiple = multiple;
  return p;
}

}  // namespace

TEST_CASE("Balancing: per-sample costs alone give shares inversely proportional to them", "[balance]") {
  const auto split = hetseq::solve_split(problem(70, {{0, 1e-3}, {0, 2e-3}, {0, 4e-3}}));
  CHECK(split.shares == std::vector<int64_t>{40, 20, 10});
  CHECK(split.micro_batches == std::vector<int64_t>{1, 1, 1});
  CHECK(split.predicted_step_s == Approx(0.040));
}

TEST_CASE("Balancing: a fixed cost per micro-batch takes samples from the rank that pays it", "[balance]") {
  // Equal per-sample cost, 20 ms more per micro-batch on rank 1: T - 0 + T - 20 ms = 100 samples x 1 ms.
  // A proportional rule would split 50/50 and wait 70 ms for rank 1.
  const auto split = hetseq::solve_split(problem(100, {{0, 1e-3}, {20e-3, 1e-3}}));
  CHECK(split.shares == std::vector<int64_t>{60, 40});
  CHECK(split.predicted_step_s == Approx(0.060));
}

TEST_CASE("Balancing: a share over the memory cap becomes several micro-batches", "[balance]") {
  // Rank 0 is fast but holds 32 samples at a time (5 ms per micro-batch); rank 1 is 4x slower per
  // sample without a cap. Equal time: 3 x 5 ms + x0 x 1 ms = x1 x 4 ms with x0 + x1 = 100.
  const auto split = hetseq::solve_split(problem(100, {{5e-3, 1e-3}, {0, 4e-3}}, {32, 0}));
  CHECK(split.shares == std::vector<int64_t>{77, 23});
  CHECK(split.micro_batches == std::vector<int64_t>{3, 1});
  CHECK(split.predicted_step_s == Approx(0.092));
  CHECK(hetseq::micro_batches_for(64, 32) == 2);
  CHECK(hetseq::micro_batches_for(65, 32) == 3);
  CHECK(hetseq::predicted_seconds({5e-3, 1e-3}, 65, 32) == Approx(3 * 5e-3 + 65e-3));
}

TEST_CASE("Balancing: shares are whole multiples of --required-batch-size-multiple and sum to U", "[balance]") {
  // 100 samples over 3 equal ranks in multiples of 8: 12 units of 8 (4 each) and 4 samples left over,
  // which go to the first of the tied ranks.
  const auto split = hetseq::solve_split(problem(100, {{0, 1e-3}, {0, 1e-3}, {0, 1e-3}}, {}, 8));
  CHECK(split.shares == std::vector<int64_t>{36, 32, 32});
  // A rank that is 1000x slower still gets one sample; the total stays U.
  const auto slow = hetseq::solve_split(problem(10, {{0, 1e-3}, {0, 1.0}}));
  CHECK(slow.shares == std::vector<int64_t>{9, 1});
  CHECK_THAT(hetseq::test::error_of<hetseq::UsageError>([] { hetseq::solve_split(problem(2, {{0, 1}, {0, 1}, {0, 1}})); }),
             Catch::Contains("2 samples per update cannot give each of 3 ranks one"));
}

TEST_CASE("Balancing: noise below the threshold changes nothing, a real imbalance does", "[balance]") {
  const std::vector<int64_t> current{50, 50};
  const auto noisy = problem(100, {{0, 1.02e-3}, {0, 1.0e-3}});
  CHECK_FALSE(hetseq::worth_switching(noisy, current, hetseq::solve_split(noisy), 0.05));
  const auto skewed = problem(100, {{0, 2e-3}, {0, 1e-3}});
  const auto better = hetseq::solve_split(skewed);
  CHECK(better.shares == std::vector<int64_t>{33, 67});
  CHECK(hetseq::worth_switching(skewed, current, better, 0.05));
  CHECK_FALSE(hetseq::worth_switching(skewed, better.shares, better, 0.05));
}

TEST_CASE("Balancing: no move of one unit improves the split, and costs are fitted from them", "[balance]") {
  const auto p = problem(192, {{3e-3, 0.7e-3}, {1e-3, 0.35e-3}, {3e-3, 0.7e-3}}, {64, 64, 64}, 2);
  const auto a = hetseq::solve_split(p);
  CHECK(std::accumulate(a.shares.begin(), a.shares.end(), int64_t{0}) == 192);
  for (int64_t share : a.shares) CHECK(share % 2 == 0);
  // The step time as this test computes it (micro-batches of at most 64, each paying the fixed part):
  // moving one unit (2 samples) from any rank to any other never makes the slowest rank faster.
  auto step = [&](const std::vector<int64_t>& shares) {
    double slowest = 0;
    for (size_t r = 0; r < shares.size(); ++r) {
      const double micro = static_cast<double>((shares[r] + 63) / 64);
      slowest = std::max(slowest, micro * p.costs[r].fixed_s + p.costs[r].per_sample_s * static_cast<double>(shares[r]));
    }
    return slowest;
  };
  CHECK(a.predicted_step_s == Approx(step(a.shares)));
  for (size_t from = 0; from < 3; ++from) {
    for (size_t to = 0; to < 3; ++to) {
      if (from == to || a.shares[from] <= 2) continue;
      std::vector<int64_t> moved = a.shares;
      moved[from] -= 2;
      moved[to] += 2;
      CAPTURE(from, to);
      CHECK(step(moved) >= step(a.shares) - 1e-12);
    }
  }
  CHECK(std::abs(a.shares[0] - a.shares[2]) <= 2);  // equal ranks: equal shares but for one unit of rounding
  CHECK(a.shares[1] > a.shares[0]);

  // t = 10 ms + 2 ms x b, measured at three sizes: intercept and slope recovered.
  const auto fit = hetseq::fit_rank_cost({{16, 0.042}, {32, 0.074}, {64, 0.138}, {32, 0.074}});
  CHECK(fit.fixed_s == Approx(0.010));
  CHECK(fit.per_sample_s == Approx(0.002));
  // One size only: the fixed part cannot be told apart, the fit is proportional.
  const auto proportional = hetseq::fit_rank_cost({{32, 0.064}, {32, 0.066}});
  CHECK(proportional.fixed_s == 0);
  CHECK(proportional.per_sample_s == Approx(0.065 / 32));
}

TEST_CASE("Sitting out: a rank whose fixed cost is longer than the update without it gets no samples, and says why",
          "[balance][sit-out]") {
  // Ranks 0 and 1 take 192 samples in 6 ms at 0.0625 ms a sample; rank 2 pays 25 ms before its first sample.
  auto p = problem(192, {{0, 62.5e-6}, {0, 62.5e-6}, {25e-3, 62.5e-6}});
  // Without leave to sit out it gets the least it can: one sample, and the update takes its 25 ms.
  const auto kept = hetseq::solve_split(p);
  CHECK(kept.shares[2] == 1);
  CHECK(kept.sat_out.empty());
  CHECK(kept.predicted_step_s > 25e-3);
  p.may_sit_out = {false, true, true};
  const auto split = hetseq::solve_split(p);
  CHECK(split.shares == std::vector<int64_t>{96, 96, 0});
  CHECK(split.micro_batches[2] == 1);
  CHECK(split.predicted_step_s == Approx(6e-3));
  REQUIRE(split.sat_out.size() == 1);
  CHECK(split.sat_out[0].rank == 2);
  CHECK(split.sat_out[0].fixed_s == Approx(25e-3 + 62.5e-6));
  // With no fixed cost its samples would have cut the update to 192 / 3 at 0.0625 ms: 4 ms, saving 2 ms.
  CHECK(split.sat_out[0].saves_s == Approx(2e-3).margin(0.1e-3));
  // Worth switching to from the split in force, and predicted as the others' time alone.
  CHECK(hetseq::worth_switching(p, {95, 95, 2}, split, 0.05));
  CHECK(hetseq::predicted_step_seconds(p, {96, 96, 0}) == Approx(6e-3));
}

TEST_CASE("Sitting out: a rank that pays off keeps its share, rank 0 never sits out, and one rank is always left",
          "[balance][sit-out]") {
  // A small fixed cost that its samples repay: rank 2 stays.
  auto cheap = problem(192, {{0, 62.5e-6}, {0, 62.5e-6}, {0.5e-3, 62.5e-6}});
  cheap.may_sit_out = {false, true, true};
  const auto stays = hetseq::solve_split(cheap);
  CHECK(stays.shares[2] > 50);
  CHECK(stays.sat_out.empty());
  // Two slow ranks, each of which holds the update back alone: both out.
  auto slow = problem(100, {{0, 1e-4}, {30e-3, 1e-4}, {30e-3, 1e-4}});
  slow.may_sit_out = {false, true, true};
  const auto split = hetseq::solve_split(slow);
  CHECK(split.shares == std::vector<int64_t>{100, 0, 0});
  REQUIRE(split.sat_out.size() == 2);
  CHECK(split.sat_out[0].rank == 1);
  CHECK(split.sat_out[1].rank == 2);
  // Rank 0 slow and not allowed out: the update waits for it anyway, so the others keep their shares.
  auto slow0 = problem(100, {{30e-3, 1e-4}, {0, 1e-4}, {30e-3, 1e-4}});
  slow0.may_sit_out = {false, true, true};
  CHECK(hetseq::solve_split(slow0).sat_out.empty());
  // Every rank allowed out: one is always left to train.
  auto two = problem(10, {{0, 1e-4}, {30e-3, 1e-4}});
  two.may_sit_out = {true, true};
  CHECK(hetseq::solve_split(two).shares == std::vector<int64_t>{10, 0});
  // A zero share is a valid data plan: its rank has one empty micro-batch, the others the whole update.
  const auto plan = hetseq::DataPlan::from_shares({96, 96, 0}, {1, 1, 1}, 2);
  CHECK(plan.sits_out(2));
  CHECK_FALSE(plan.sits_out(1));
  CHECK(plan.samples_per_update() == 192);
  CHECK(plan.slice_offset(2) == 192);
  CHECK_THROWS_WITH(hetseq::DataPlan::from_shares({0, 0}, {1, 1}, 0),
                    Catch::Contains("every rank's share is 0; at least one rank must train"));
}
