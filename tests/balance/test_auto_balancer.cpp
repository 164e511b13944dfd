// The balancer, level 1: its cost window, and AutoBalancer on ranks as threads with real Gloo groups
// and the reducer's statistics sum as the gather. The compute times are given (a slow rank is one
// whose times say so), so the expected splits are exact; the level-2 tests time real processes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "hetseq/balance/auto_balancer.h"
#include "hetseq/balance/cost_window.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/channel/group_channel.h"
#include "support/error_message.h"
#include "support/rank_threads.h"

using namespace hetseq;

TEST_CASE("Cost window: a fixed and a per-sample cost are recovered from two sizes, and old samples leave",
          "[balance]") {
  CostWindow w(4);
  // 2 ms per micro-batch + 0.5 ms per sample, measured at 32 and 64 samples, one run of 96 in two.
  w.add({32, 1, 0.002 + 0.016});
  w.add({64, 1, 0.002 + 0.032});
  w.add({96, 2, 2 * 0.002 + 0.048});
  w.add({0, 1, 5.0});  // no samples: ignored
  REQUIRE(w.size() == 3);
  const RankCost c = w.fit();
  CHECK(c.fixed_s == Approx(0.002).epsilon(1e-9));
  CHECK(c.per_sample_s == Approx(0.0005).epsilon(1e-9));
  CHECK(w.seconds_per_sample() == Approx((0.018 + 0.034 + 0.052) / 192.0));
  // Two more measurements at another speed push the oldest (32 samples) out of a window of 4.
  w.add({64, 1, 0.064});
  w.add({64, 1, 0.064});
  CHECK(w.size() == 4);
  CHECK(w.seconds_per_sample() == Approx((0.034 + 0.052 + 0.128) / (64.0 + 96.0 + 128.0)));
  // Noise: 0.1 and 0.3 s per sample have mean 0.2, standard deviation 0.1414 and standard error 0.1.
  CostWindow noisy(4);
  CHECK(noisy.relative_error() == 0);
  noisy.add({10, 1, 1.0});
  CHECK(noisy.relative_error() == 0);
  noisy.add({10, 1, 3.0});
  CHECK(noisy.relative_error() == Approx(0.5));
}

namespace {

// What one rank thread saw: its split after every update, and the balancer's change count.
struct Seen {
  std::vector<std::vector<int64_t>> shares;     // [update][rank]
  std::vector<std::vector<int64_t>> micro;      // [update][rank] micro-batches
  int64_t changes = 0;
  double balance_eff = -1;
};

// Runs `updates` updates of a world of 3 through AutoBalancer only: rank r's compute per update is
// `seconds(r, share, micro_batches)`, given, not measured.
std::vector<Seen> run_balancer(const BalanceOptions& options, int updates,
                               const std::function<double(int, int64_t, int64_t)>& seconds) {
  test::OneIntraOpThread one_thread;
  std::vector<Seen> seen(3);
  test::run_ranks(3, [&](int rank, const test::Group& group) {
    auto channel = std::make_shared<GroupChannel>(group, torch::kCPU, false);
    PlanSchedule schedule({64, 64, 64}, {{1}, {1}, {1}}, {64, 64, 64}, rank);
    AutoBalancer balancer(schedule, [channel](const std::vector<double>& v) { return channel->gather(v); }, options);
    UpdateResult result;
    balancer.on_epoch_begin(1);
    for (int n = 1; n <= updates; ++n) {
      const DataPlan plan = schedule.train_plan(1);
      std::vector<std::vector<int64_t>> ids(static_cast<size_t>(plan.update_freqs[rank]));
      for (int64_t k = 0; k < plan.update_freqs[rank]; ++k) {
        ids[k].resize(static_cast<size_t>(plan.micro_batch_begin(rank, k + 1) - plan.micro_batch_begin(rank, k)));
      }
      UpdateRecord r;
      r.epoch = 1;
      r.num_updates = n;
      r.rank = rank;
      r.sample_ids = &ids;
      r.batch_sizes = plan.batch_sizes;
      r.shares = plan.all_shares();
      r.result = &result;
      r.times.compute_s = seconds(rank, plan.share(rank), plan.update_freqs[rank]);
      r.times.total_s = r.times.compute_s;
      balancer.on_update(r);
      seen[rank].shares.push_back(schedule.train_plan(1).all_shares());
      seen[rank].micro.push_back(schedule.train_plan(1).update_freqs);
    }
    std::vector<Stat> stats;
    balancer.add_epoch_stats(1, stats);
    for (const auto& s : stats) {
      if (s.name == "balance_eff") seen[rank].balance_eff = s.value;
    }
    seen[rank].changes = balancer.changes();
  });
  return seen;
}

}  // namespace

TEST_CASE("Auto-balancer: a rank twice as slow per sample gets half the share, every rank the same split",
          "[balance]") {
  BalanceOptions o;
  o.enabled = true;
  o.interval = 4;
  // Rank 2 takes 2 ms per sample, ranks 0 and 1 take 1 ms, plus 1% noise that differs by update.
  const auto seen = run_balancer(o, 24, [](int rank, int64_t share, int64_t) {
    static thread_local int calls = 0;
    const double noise = 1.0 + 0.01 * std::sin(++calls * 1.7 + rank);
    return (rank == 2 ? 2e-3 : 1e-3) * static_cast<double>(share) * noise;
  });
  // Equal finish times: 192 = x + x + x/2, so 76.8, 76.8, 38.4.
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    if (rank > 0) CHECK(seen[rank].shares == seen[0].shares);  // the ranks agree, update for update
    const auto& last = seen[rank].shares.back();
    CHECK(std::abs(last[0] - 77) <= 1);
    CHECK(std::abs(last[1] - 77) <= 1);
    CHECK(std::abs(last[2] - 38) <= 1);
  }
  // The first re-plan (update 4) moves the split; 1% noise under the 3% threshold moves it no more.
  CHECK(seen[0].shares[2] == std::vector<int64_t>{64, 64, 64});
  CHECK(seen[0].shares[3] != std::vector<int64_t>{64, 64, 64});
  CHECK(seen[0].changes == 1);
  CHECK(seen[0].balance_eff > 0.5);
}

TEST_CASE("Auto-balancer: 20% noise between identical ranks moves nothing, a real slowdown still does",
          "[balance]") {
  BalanceOptions o;
  o.enabled = true;
  o.interval = 4;
  // Updates alternate 20% fast and slow, out of phase between ranks 0 and 1: a window of 3 or 4 sees
  // one rank up to 7% slower than the other, past a fixed 3% threshold but not past the deadband that
  // this noise sets (twice the relative standard error, about 20%).
  auto noisy = [](int rank, int64_t share, bool slow_rank_2) {
    static thread_local int calls = 0;
    const double noise = 1.0 + 0.2 * (((++calls + rank) % 2) != 0 ? 1 : -1);
    return (slow_rank_2 && rank == 2 ? 3e-3 : 1e-3) * static_cast<double>(share) * noise;
  };
  const auto calm = run_balancer(o, 24, [&](int rank, int64_t share, int64_t) { return noisy(rank, share, false); });
  CHECK(calm[0].changes == 0);
  CHECK(calm[0].shares.back() == std::vector<int64_t>{64, 64, 64});
  // Rank 2 three times slower: a predicted gain of about 2x passes the same deadband.
  const auto slow = run_balancer(o, 24, [&](int rank, int64_t share, int64_t) { return noisy(rank, share, true); });
  CHECK(slow[0].changes >= 1);
  CHECK(slow[0].shares.back()[2] < 40);
}

TEST_CASE("Auto-balancer: a share over a rank's cap runs as several micro-batches", "[balance]") {
  BalanceOptions o;
  o.enabled = true;
  o.interval = 4;
  o.caps = {0, 40, 0};
  // Rank 1 is 4x faster per sample than the others but may run at most 40 samples at once.
  const auto seen = run_balancer(o, 12, [](int rank, int64_t share, int64_t micro) {
    return 1e-4 * static_cast<double>(micro) + (rank == 1 ? 0.25e-3 : 1e-3) * static_cast<double>(share);
  });
  const auto& last = seen[0].shares.back();
  CAPTURE(last);
  CHECK(last[0] + last[1] + last[2] == 192);
  CHECK(last[1] > 80);  // 4x faster: about 4/6 of 192 = 128 before the micro-batch costs
  CHECK(seen[0].micro.back()[1] == (last[1] + 39) / 40);
  CHECK(seen[0].micro.back()[0] == 1);
}

TEST_CASE("Auto-balancer: off, it measures and keeps the split", "[balance]") {
  BalanceOptions o;
  o.enabled = false;
  o.interval = 2;
  log::begin_capture();
  const auto seen = run_balancer(o, 10, [](int rank, int64_t share, int64_t) {
    return (rank == 0 ? 3e-3 : 1e-3) * static_cast<double>(share);
  });
  const std::vector<std::string> lines = log::end_capture();
  // Rank 0 suggests balancing, with the split it would use and the predicted gain: 3 ms x 64 against
  // equal finish times at 192 / (1/3 + 1 + 1) samples per ms.
  const std::string expected = "--auto-balance would split [64,64,64] as [28,82,82], predicted 2.29x faster";
  CHECK(std::count_if(lines.begin(), lines.end(),
                      [&](const std::string& l) { return l.find(expected) != std::string::npos; }) == 1);
  CHECK(seen[0].shares.back() == std::vector<int64_t>{64, 64, 64});
  CHECK(seen[0].changes == 0);
  // The step takes as long as rank 0 (3 * 64 ms); the compute speeds allow 1/3 + 1 + 1 samples per ms.
  CHECK(seen[0].balance_eff == Approx(192.0 / (3e-3 * 64) / (1 / 3e-3 + 2 / 1e-3)).epsilon(1e-6));
}

TEST_CASE("Auto-balancer: bad options are clear errors", "[balance]") {
  PlanSchedule schedule({64, 64}, {{1}, {1}}, {64, 64}, 0);
  auto gather = [](const std::vector<double>& v) { return std::vector<std::vector<double>>{v, v}; };
  BalanceOptions o;
  o.interval = 0;
  CHECK_THAT(test::error_of<UsageError>([&] { AutoBalancer(schedule, gather, o); }),
             Catch::Contains("--balance-interval: 0 must be a positive number of updates"));
  o.interval = 5;
  o.caps = {64};
  CHECK_THAT(test::error_of<UsageError>([&] { AutoBalancer(schedule, gather, o); }),
             Catch::Contains("--balance-cap: 1 caps for 2 ranks"));
}
