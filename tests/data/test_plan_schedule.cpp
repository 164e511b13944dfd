// The plan schedule: a split that changes between updates keeps every sample once per epoch and the
// same samples in every step (Note [Plan schedule]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <map>
#include <set>

#include "hetseq/core/error.h"
#include "hetseq/data/epoch_batch_iterator.h"
#include "hetseq/data/plan_schedule.h"
#include "support/error_message.h"

using hetseq::DataPlan;
using hetseq::EpochBatchIterator;
using hetseq::PlanSchedule;

namespace {

// The samples of one update over all ranks, each rank walking its own iterator as a rank process would.
std::vector<int64_t> one_step(std::vector<EpochBatchIterator>& ranks) {
  std::vector<int64_t> step;
  for (auto& it : ranks) {
    for (const auto& mb : it.next_update()) step.insert(step.end(), mb.begin(), mb.end());
  }
  return step;
}

}  // namespace

TEST_CASE("Plan schedule: a split changed mid-epoch keeps each step's samples and every sample once", "[data]") {
  const int64_t n = 103;
  // 3 ranks: 8, 4 and 2x6 samples: U = 24 per update, 5 updates per epoch (the last one short).
  std::vector<PlanSchedule> schedules;
  for (int64_t r = 0; r < 3; ++r) {
    schedules.emplace_back(std::vector<int64_t>{8, 4, 6}, std::vector<std::vector<int64_t>>{{1}, {1}, {2}},
                           std::vector<int64_t>{8, 8, 8}, r);
  }
  hetseq::EpochIteratorOptions order;
  order.seed = 7;
  std::vector<EpochBatchIterator> ranks, fixed;
  for (int64_t r = 0; r < 3; ++r) {
    ranks.emplace_back(n, schedules[r].train_plan(1), order);
    fixed.emplace_back(n, schedules[r].train_plan(1), order);
    ranks.back().begin_epoch(1);
    fixed.back().begin_epoch(1);
  }
  // New splits after updates 1 and 3, the same on every rank: a larger share for rank 2, then a rank
  // with two micro-batches of another size.
  const std::map<int, std::pair<std::vector<int64_t>, std::vector<int64_t>>> splits{
      {1, {{2, 4, 9}, {1, 1, 2}}}, {3, {{3, 3, 9}, {3, 2, 1}}}};
  std::multiset<int64_t> seen;
  for (int update = 1; !ranks[0].end_of_epoch(); ++update) {
    std::vector<int64_t> step = one_step(ranks), reference = one_step(fixed);
    CHECK(step.size() == reference.size());
    std::sort(step.begin(), step.end());
    std::sort(reference.begin(), reference.end());
    CHECK(step == reference);  // the same samples form the step, whatever the split
    seen.insert(step.begin(), step.end());
    if (auto it = splits.find(update); it != splits.end()) {
      for (int64_t r = 0; r < 3; ++r) {
        schedules[r].set_split(1, it->second.first, it->second.second);
        ranks[r].set_plan(schedules[r].train_plan(1));
      }
    }
    REQUIRE(update <= 5);
  }
  CHECK(ranks[1].plan().batch_sizes == std::vector<int64_t>{3, 3, 9});
  CHECK(schedules[0].version() == 2);
  REQUIRE(seen.size() == static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) CHECK(seen.count(i) == 1);
}

TEST_CASE("Plan schedule: a split with another total is refused, and an epoch with another total starts afresh",
          "[data]") {
  PlanSchedule s({8, 4}, {{1, 2}, {1}}, {16, 16}, 0);
  CHECK(s.train_plan(1).samples_per_update() == 12);
  CHECK(s.train_plan(2).samples_per_update() == 20);
  CHECK_THAT(hetseq::test::error_of<hetseq::UsageError>([&] { s.set_split(1, {8, 8}, {1, 1}); }),
             Catch::Contains("takes 16 samples per update, the run takes 12"));
  s.set_split(1, {6, 6}, {1, 1});
  CHECK(s.train_plan(1).batch_sizes == std::vector<int64_t>{6, 6});
  // Epoch 2 takes 2x8 + 4 = 20 samples per update (--update-freq 1,2 on rank 0): the 12-sample split
  // does not apply there.
  CHECK(s.train_plan(2).batch_sizes == std::vector<int64_t>{8, 4});
  CHECK(s.train_plan(2).update_freqs == std::vector<int64_t>{2, 1});
  CHECK(s.micro_batches_per_update(2) == 3);
  CHECK(s.valid_plan().batch_sizes == std::vector<int64_t>{16, 16});
  CHECK_THAT(hetseq::test::error_of<hetseq::UsageError>([&] { PlanSchedule({8}, {{0}}, {8}, 0); }),
             Catch::Contains("--update-freq: rank 0 has 0"));
}

TEST_CASE("Plan schedule: a balanced share is cut into even micro-batches and every sample is used once", "[data]") {
  // 71 + 60 + 61 = 192 samples per update; rank 0 runs its 71 in two micro-batches (a cap of 64).
  const DataPlan plan = DataPlan::from_shares({71, 60, 61}, {2, 1, 1}, 0);
  CHECK(plan.batch_sizes == std::vector<int64_t>{36, 60, 61});
  CHECK(plan.samples_per_update() == 192);
  CHECK(plan.slice_offset(2) == 131);
  std::vector<EpochBatchIterator> ranks;
  for (int64_t r = 0; r < 3; ++r) {
    DataPlan p = plan;
    p.rank = r;
    ranks.emplace_back(1000, p, hetseq::EpochIteratorOptions{});
    ranks.back().begin_epoch(1);
  }
  EpochBatchIterator probe = ranks[0];
  const auto first = probe.next_update();
  REQUIRE(first.size() == 2);
  CHECK(first[0].size() == 35);  // [floor(0 * 71/2), floor(71/2)) = 35 samples, then 36
  CHECK(first[1].size() == 36);
  std::vector<int64_t> all;
  while (!ranks[0].end_of_epoch()) {
    const auto step = one_step(ranks);
    all.insert(all.end(), step.begin(), step.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(1000);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(all == expected);
}

TEST_CASE("Plan schedule: set_shares keeps the samples per update and rejects a share below its micro-batches",
          "[data]") {
  PlanSchedule s({64, 64, 64}, {{1}, {1}, {1}}, {64, 64, 64}, 2);
  s.set_shares(1, {71, 60, 61}, {2, 1, 1});
  CHECK(s.version() == 1);
  CHECK(s.train_plan(1).all_shares() == std::vector<int64_t>{71, 60, 61});
  CHECK(s.train_plan(3).update_freqs == std::vector<int64_t>{2, 1, 1});  // the split holds in later epochs
  CHECK(s.micro_batches_per_update(1) == 4);
  CHECK_THAT(hetseq::test::error_of<hetseq::UsageError>([&] { s.set_shares(1, {72, 60, 61}, {2, 1, 1}); }),
             Catch::Contains("takes 193 samples per update, the run takes 192"));
  CHECK_THAT(hetseq::test::error_of<hetseq::UsageError>([&] { s.set_shares(1, {1, 130, 61}, {2, 1, 1}); }),
             Catch::Contains("rank 0 has a share of 1 samples in 2 micro-batches"));
}

TEST_CASE("Plan schedule: validation follows a balanced split, a rank that sits out validates nothing, and every "
          "validation sample is still taken once",
          "[data]") {
  // Note [Validating a balanced split]: validation batches 10, 10, 7 (27 a step); training shares 95, 95, 0.
  PlanSchedule s({96, 96, 2}, {{1}, {1}, {1}}, {10, 10, 7}, 0);
  CHECK(s.valid_plan(1).all_shares() == std::vector<int64_t>{10, 10, 7});  // no split yet: the configured plan
  s.set_shares(1, {97, 97, 0}, {1, 1, 1});
  const DataPlan v = s.valid_plan(1);
  CHECK(v.all_shares() == std::vector<int64_t>{14, 13, 0});  // 27 * 97 / 194 = 13.5 each, the remainder to rank 0
  CHECK(v.update_freqs == std::vector<int64_t>{2, 2, 1});    // micro-batches of at most 10
  CHECK(v.sits_out(2));
  // 100 validation samples: every one once over the ranks, none on rank 2.
  std::multiset<int64_t> seen;
  for (int64_t r = 0; r < 3; ++r) {
    DataPlan p = v;
    p.rank = r;
    hetseq::EpochIteratorOptions order;
    order.shuffle = false;
    EpochBatchIterator it(100, p, order);
    it.begin_epoch(1);
    while (!it.end_of_epoch()) {
      for (const auto& mb : it.next_update()) {
        if (r == 2) CHECK(mb.empty());
        seen.insert(mb.begin(), mb.end());
      }
    }
  }
  CHECK(seen.size() == 100);
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 100);
  // Shares that give a rank more than its validation batch take it in several micro-batches.
  s.set_shares(1, {180, 8, 6}, {2, 1, 1});
  const DataPlan w = s.valid_plan(1);
  CHECK(w.all_shares() == std::vector<int64_t>{25, 1, 1});
  CHECK(w.update_freqs == std::vector<int64_t>{3, 1, 1});
}
