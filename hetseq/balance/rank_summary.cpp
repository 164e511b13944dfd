#include "hetseq/balance/rank_summary.h"

#include <algorithm>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {
namespace {

// What each rank sends to the gather, in this order.
enum Field { kUpdates, kSamples, kCompute, kWait, kTotal, kBusy, kBytes, kShare };

// The figures of a summary, [figure][rank], in this order.
const std::vector<const char*> kFigureNames{"batch",     "compute_ms",     "compute_ms_per_sample",
                                            "wait_ms",   "wait_share",     "busbw_gb_per_s",
                                            "comm_ms",   "comm_overlap"};

}  // namespace

RankSummary::RankSummary(GatherFn gather, ProgressLogger& logger, const AutoBalancer* balancer,
                         RankSummaryOptions options)
    : gather_(std::move(gather)), logger_(logger), balancer_(balancer), options_(options) {
  HETSEQ_ASSERT(options_.log_interval > 0, "a log interval of {}", options_.log_interval);
}

void RankSummary::add(Totals& into, const UpdateRecord& r) {
  const auto share = static_cast<double>(r.shares.at(static_cast<size_t>(r.rank)));
  into.updates += 1;
  into.samples += share;
  into.compute_s += r.times.compute_s;
  into.wait_s += r.times.comm_wait_s;
  into.total_s += r.times.total_s;
  into.busy_s += r.times.comm_busy_s;
  into.bytes += static_cast<double>(r.times.comm_bytes);
  into.share = share;
}

void RankSummary::on_update(const UpdateRecord& record) {
  rank_ = record.rank;
  num_updates_ = record.num_updates;
  add(interval_, record);
  add(epoch_, record);
  // The same update index on every rank (every rank runs every update), so the gathers match up.
  if (record.index_in_epoch % options_.log_interval != 0) return;
  report(record.epoch, record.num_updates, interval_, options_.log_all_ranks, false);
  interval_ = Totals{};
}

void RankSummary::add_epoch_stats(int64_t epoch, std::vector<Stat>& stats) {
  report(epoch, num_updates_, epoch_, true, true);
  epoch_ = interval_ = Totals{};
}

void RankSummary::report(int64_t epoch, int64_t num_updates, const Totals& t, bool text, bool epoch_end) {
  const std::vector<std::vector<double>> all =
      gather_({t.updates, t.samples, t.compute_s, t.wait_s, t.total_s, t.busy_s, t.bytes, t.share});  // [rank][field]
  const auto n = static_cast<double>(options_.world_size);
  std::vector<std::vector<double>> fig(kFigureNames.size());  // [figure][rank]
  size_t slowest = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    const auto& f = all[r];
    const double updates = std::max(1.0, f[kUpdates]);
    fig[0].push_back(f[kShare]);
    fig[1].push_back(1e3 * f[kCompute] / updates);
    fig[2].push_back(f[kSamples] > 0 ? 1e3 * f[kCompute] / f[kSamples] : 0);
    fig[3].push_back(1e3 * f[kWait] / updates);
    fig[4].push_back(f[kTotal] > 0 ? f[kWait] / f[kTotal] : 0);
    // Bus bandwidth as nccl-tests defines it, alg x 2(n-1)/n, over the time at least one bucket's
    // allreduce was in flight. On a rank that reaches a bucket before its peers that time includes
    // waiting for them, so the slowest rank's figure is the closest to what the network does.
    fig[5].push_back(f[kBusy] > 0 ? f[kBytes] / f[kBusy] * 2 * (n - 1) / n / 1e9 : 0);
    // The time a bucket was in flight per update, and the share of it hidden behind backward (the
    // rest is the wait after the last bucket's launch).
    fig[6].push_back(1e3 * f[kBusy] / updates);
    fig[7].push_back(f[kBusy] > 0 ? std::clamp(1 - f[kWait] / f[kBusy], 0.0, 1.0) : 0);
    if (fig[1][r] > fig[1][slowest]) slowest = r;
  }
  if (rank_ != 0 || all.empty() || all[0][kUpdates] <= 0) return;

  std::optional<AutoBalancer::Suggestion> suggestion;
  if (epoch_end && balancer_) suggestion = balancer_->suggestion();
  std::vector<Stat> stats;
  stats.push_back({"num_updates", static_cast<double>(num_updates), true});
  for (size_t k = 0; k < fig.size(); ++k) {
    if (k == 0) {
      std::vector<int64_t> batch;
      for (double b : fig[0]) batch.push_back(static_cast<int64_t>(b));
      stats.push_back({kFigureNames[k], 0, true, batch});
    } else {
      stats.push_back({kFigureNames[k], 0, false, {}, fig[k]});
    }
  }
  stats.push_back({"slowest", static_cast<double>(slowest), true});
  if (suggestion) {
    stats.push_back({"suggested_split", 0, true, suggestion->shares});
    stats.push_back({"predicted_gain", suggestion->gain});
  }
  logger_.record(epoch, epoch_end ? "ranks_epoch" : "ranks", stats);
  if (!text) return;
  logger_.finish_bar();
  log::info("[ranks] {} {}: where each rank's time goes{}", epoch_end ? "epoch" : "update",
            epoch_end ? epoch : num_updates, epoch_end ? "" : fmt::format(" over the last {} updates", options_.log_interval));
  for (size_t r = 0; r < all.size(); ++r) {
    log::info("[ranks]   rank {}: {} samples per update, compute {:.1f} ms per update ({:.3f} ms per sample), waiting on "
              "communication {:.1f} ms ({:.0f}%), allreduce bus bandwidth {:.2f} GB/s, in flight {:.1f} ms "
              "({:.0f}% behind backward){}",
              r, static_cast<int64_t>(fig[0][r]), fig[1][r], fig[2][r], fig[3][r], 100 * fig[4][r],
              fig[5][r], fig[6][r], 100 * fig[7][r], all.size() > 1 && r == slowest ? "  <- slowest" : "");
  }
  if (suggestion) {
    log::info("[ranks]   --auto-balance would split [{}] as [{}]: predicted {:.2f}x faster per update",
              fmt::join(fig[0], ","), fmt::join(suggestion->shares, ","), suggestion->gain);
  }
}

}  // namespace hetseq
