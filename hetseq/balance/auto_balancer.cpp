#include "hetseq/balance/auto_balancer.h"

#include <algorithm>
#include <numeric>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {
namespace {

// The figures each rank contributes to a gather, in this order.
enum Figure : size_t {
  kFixed,           // fitted seconds per micro-batch
  kPerSample,       // fitted seconds per sample
  kPoints,          // measurements in the window (0: nothing to fit yet)
  kSinceStep,       // step wall time since the last applied split
  kSinceSteps,
  kEpochCompute,    // this epoch: compute seconds, samples, step wall seconds, steps
  kEpochSamples,
  kEpochStep,
  kEpochSteps,
  kNoise,           // relative standard error of the per-sample cost (CostWindow::relative_error)
  kFigures
};

std::string ms_list(const std::vector<double>& seconds) {
  std::vector<std::string> out;
  for (double s : seconds) out.push_back(fmt::format("{:.1f}", 1e3 * s));
  return fmt::format("{}", fmt::join(out, "/"));
}

}  // namespace

AutoBalancer::AutoBalancer(PlanSchedule& schedule, GatherFn gather, BalanceOptions options)
    : schedule_(schedule),
      gather_(std::move(gather)),
      options_(std::move(options)),
      window_(static_cast<size_t>(options_.window > 0 ? options_.window : std::max<int64_t>(4, options_.interval))),
      rank_(schedule.rank()) {
  if (options_.interval <= 0) {
    throw UsageError(fmt::format("--balance-interval: {} must be a positive number of updates", options_.interval));
  }
  if (options_.threshold < 0 || options_.threshold >= 1) {
    throw UsageError(fmt::format("--balance-threshold: {} must be in [0, 1), a share of the step time",
                                 options_.threshold));
  }
  if (options_.caps.empty()) options_.caps.assign(static_cast<size_t>(schedule.world_size()), 0);
  if (static_cast<int64_t>(options_.caps.size()) != schedule.world_size()) {
    throw UsageError(fmt::format("--balance-cap: {} caps for {} ranks", options_.caps.size(), schedule.world_size()));
  }
}

void AutoBalancer::on_epoch_begin(int64_t /*epoch*/) { epoch_ = Totals{}; }

void AutoBalancer::on_update(const UpdateRecord& r) {
  ++updates_;
  shares_ = r.shares;
  int64_t samples = 0;
  for (const auto& micro_batch : *r.sample_ids) samples += static_cast<int64_t>(micro_batch.size());
  const double compute_s = r.times.data_s + r.times.compute_s;
  // The first update of a process warms up (allocations, caches), and a short last update of an
  // epoch says little: neither is measured.
  if (updates_ > 1 && samples == r.shares[static_cast<size_t>(rank_)]) {
    window_.add({samples, static_cast<int64_t>(r.sample_ids->size()), compute_s});
    for (Totals* t : {&epoch_, &since_change_}) {
      t->compute_s += compute_s;
      t->samples += static_cast<double>(samples);
      t->step_s += r.times.total_s;
      t->steps += 1;
    }
  }
  // On the global update count, so that a resumed run re-plans where the run never stopped would.
  if (options_.enabled && r.num_updates % options_.interval == 0 && r.num_updates != planned_at_) {
    planned_at_ = r.num_updates;
    replan(r);
  }
}

std::vector<double> AutoBalancer::local_figures() const {
  std::vector<double> f(kFigures, 0.0);
  if (!window_.empty()) {
    const RankCost cost = window_.fit();
    f[kFixed] = cost.fixed_s;
    f[kPerSample] = cost.per_sample_s;
    f[kPoints] = static_cast<double>(window_.size());
    f[kNoise] = window_.relative_error();
  }
  f[kSinceStep] = since_change_.step_s;
  f[kSinceSteps] = since_change_.steps;
  f[kEpochCompute] = epoch_.compute_s;
  f[kEpochSamples] = epoch_.samples;
  f[kEpochStep] = epoch_.step_s;
  f[kEpochSteps] = epoch_.steps;
  return f;
}

double AutoBalancer::deadband(const std::vector<std::vector<double>>& all, const std::vector<int64_t>& shares) const {
  double noise = 0;
  // A rank that sits out is measured by rare probes: its noise says nothing of the split among the others.
  for (size_t r = 0; r < all.size(); ++r) {
    if (r >= shares.size() || shares[r] > 0) noise = std::max(noise, all[r][kNoise]);
  }
  if (!options_.widen_to_noise) return options_.threshold;
  return std::min(0.5, std::max(options_.threshold, 2 * noise));
}

SplitProblem AutoBalancer::problem(const std::vector<std::vector<double>>& all, int64_t samples_per_update) const {
  SplitProblem p;
  p.samples_per_update = samples_per_update;
  for (const auto& f : all) p.costs.push_back(RankCost{f[kFixed], f[kPerSample]});
  p.caps = options_.caps;
  p.multiple = options_.multiple;
  return p;
}

// One re-plan (see Note [Balancing]): gather the fits, solve, report the split in force (measured step
// time next to the prediction made when it was applied), and apply a new one past the hysteresis.
void AutoBalancer::replan(const UpdateRecord& r) {
  const std::vector<std::vector<double>> all = gather_(local_figures());
  for (const auto& f : all) {
    if (f[kPoints] <= 0) return;  // a rank has nothing measured yet
  }
  const int64_t total = std::accumulate(r.shares.begin(), r.shares.end(), int64_t{0});
  SplitProblem p = problem(all, total);
  // Not before update 2: the c10d::Reducer settles its buckets with every rank at the start of update 2.
  if (options_.sit_out && r.num_updates >= 2) {
    p.may_sit_out.assign(all.size(), true);
    p.may_sit_out[0] = false;  // rank 0 writes the checkpoints and the log (Note [Sharing an update])
  }
  const Split split = solve_split(p);
  double measured_s = 0;  // the step wall time of the split in force, the slowest rank's view
  for (const auto& f : all) measured_s = std::max(measured_s, f[kSinceSteps] > 0 ? f[kSinceStep] / f[kSinceSteps] : 0);
  if (predicted_s_ && rank_ == 0) {
    log::info("[balance] update {}: split [{}] measured {:.1f} ms per update (predicted {:.1f} ms of compute)",
              r.num_updates, fmt::join(r.shares, ","), 1e3 * measured_s, 1e3 * *predicted_s_);
  }
  predicted_s_.reset();
  const double band = deadband(all, r.shares);
  if (!worth_switching(p, r.shares, split, band)) return;
  schedule_.set_shares(r.epoch, split.shares, split.micro_batches);
  ++changes_;
  since_change_ = Totals{};
  predicted_s_ = split.predicted_step_s;
  if (rank_ != 0) return;
  std::vector<double> per_sample;
  for (const auto& c : p.costs) per_sample.push_back(c.per_sample_s);
  const bool several = std::any_of(split.micro_batches.begin(), split.micro_batches.end(), [](int64_t m) { return m > 1; });
  log::info("[balance] update {}: split [{}] -> [{}] samples per update{}; predicted compute per update {:.1f} -> "
            "{:.1f} ms (measured {:.1f} ms per update; ms per sample by rank {}; deadband {:.1f}%)",
            r.num_updates, fmt::join(r.shares, ","), fmt::join(split.shares, ","),
            several ? fmt::format(" in [{}] micro-batches", fmt::join(split.micro_batches, ",")) : "",
            1e3 * predicted_step_seconds(p, r.shares), 1e3 * split.predicted_step_s, 1e3 * measured_s,
            ms_list(per_sample), 100 * band);
  for (const SitOut& out : split.sat_out) {
    if (r.shares[static_cast<size_t>(out.rank)] == 0) continue;
    log::info("[balance] rank {} sits out: it adds {:.1f} ms per update of fixed cost and would save {:.1f} ms",
              out.rank, 1e3 * out.fixed_s, 1e3 * out.saves_s);
  }
  for (size_t q = 0; q < split.shares.size(); ++q) {
    if (r.shares[q] != 0 || split.shares[q] == 0) continue;
    log::info("[balance] rank {} takes part again: {} samples per update, predicted {:.1f} ms of compute", q,
              split.shares[q], 1e3 * predicted_seconds(p.costs[q], split.shares[q], p.caps[q]));
  }
}

void AutoBalancer::add_epoch_stats(int64_t epoch, std::vector<Stat>& stats) {
  suggestion_.reset();
  const std::vector<std::vector<double>> all = gather_(local_figures());
  double ideal = 0, samples = 0, step_s = 0;  // samples/s the compute speeds allow; measured samples and time
  for (size_t q = 0; q < all.size(); ++q) {
    const auto& f = all[q];
    if (q < shares_.size() && shares_[q] == 0) continue;  // it sat out: no part of the speed
    if (f[kEpochCompute] <= 0) return;  // nothing measured on a rank (a very short epoch)
    ideal += f[kEpochSamples] / f[kEpochCompute];
    samples += f[kEpochSamples];
    step_s = std::max(step_s, f[kEpochStep]);
  }
  const double measured = step_s > 0 ? samples / step_s : 0;
  const double efficiency = ideal > 0 ? measured / ideal : 0;
  stats.push_back({"balance_eff", efficiency});
  if (rank_ == 0) {
    log::info("[balance] epoch {}: {:.0f} samples/s measured, {:.0f}% of the {:.0f} samples/s the ranks' compute "
              "speeds allow; split [{}]{}",
              epoch, measured, 100 * efficiency, ideal, fmt::join(shares_, ","),
              options_.enabled ? fmt::format(", {} change(s) so far", changes_) : "");
  }
  if (!options_.enabled) suggest(epoch, all);
}

// With --auto-balance off: what balancing would gain. The split stayed the same all epoch, so the
// epoch's compute per sample of each rank is the cost model, with the fixed part folded in: it
// averages over the whole epoch where the last window's fit (what a re-plan uses) can catch a few
// noisy updates and suggest moving samples between identical ranks.
void AutoBalancer::suggest(int64_t epoch, const std::vector<std::vector<double>>& all) {
  if (rank_ != 0 || shares_.empty()) return;
  for (const auto& f : all) {
    if (f[kPoints] <= 0 || f[kEpochSamples] <= 0) return;
  }
  const int64_t total = std::accumulate(shares_.begin(), shares_.end(), int64_t{0});
  SplitProblem p = problem(all, total);
  for (size_t q = 0; q < all.size(); ++q) p.costs[q] = RankCost{0, all[q][kEpochCompute] / all[q][kEpochSamples]};
  const Split split = solve_split(p);
  if (!worth_switching(p, shares_, split, std::max(deadband(all, shares_), 0.05))) return;
  std::vector<double> compute;
  for (size_t q = 0; q < all.size(); ++q) compute.push_back(predicted_seconds(p.costs[q], shares_[q], p.caps[q]));
  suggestion_ = Suggestion{split.shares, predicted_step_seconds(p, shares_) / split.predicted_step_s};
  log::info("[balance] epoch {}: the ranks are unbalanced (compute per update by rank {} ms): --auto-balance would "
            "split [{}] as [{}], predicted {:.2f}x faster per update",
            epoch, ms_list(compute), fmt::join(shares_, ","), fmt::join(split.shares, ","),
            predicted_step_seconds(p, shares_) / split.predicted_step_s);
}

}  // namespace hetseq
