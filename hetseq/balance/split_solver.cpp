#include "hetseq/balance/split_solver.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <set>

#include "hetseq/core/error.h"

namespace hetseq {

// Note [Balancing]
// ~~~~~~~~~~~~~~~~
// In a synchronous step every rank waits for the slowest, so the step takes max_r t_r(s_r), where s_r
// is rank r's share of the update's U samples. U itself never changes: it is what --max-sentences and
// --update-freq make it, so each step is the same samples, every sample is used once per epoch, and
// the LR schedule and the training stay the user's (Note [Plan schedule]); only the cut between ranks
// moves (Note [Data plan]). This is where we differ from Cannikin and AdaptDL, which change the total
// batch and the learning rate, and from DBS, which re-shards per epoch.
//
// The signal. Each rank times its own compute per update: data wait, forward and backward, without
// the time backward spends waiting for the gradient allreduce (PhaseTimes::compute_s). Timing the
// whole backward would be useless: the allreduce inside it makes every rank as slow as the slowest.
//
// The model. t_r(s) = m_r(s) * a_r + c_r * s with m_r(s) = ceil(s / cap_r): a fixed cost a_r per
// micro-batch plus c_r per sample (Cephalo's intercept + slope model), a share above the memory cap
// (--balance-cap) cut into m_r micro-batches accumulated without sync. A proportional rule
// (s_r ~ 1/c_r) misjudges ranks with a large fixed cost. Each rank fits (a_r, c_r) by least squares
// over a window of its recent updates (per micro-batch: size, seconds); the fixed part only where the
// sizes span a factor of 2, since nearby sizes make the intercept mostly noise. The window is one
// re-plan interval long by default: each re-plan sees the conditions since the last one, so a load
// that arrives or leaves is followed within two intervals instead of being averaged with the past.
//
// The split. The step is shortest when all ranks finish together: find T with sum_r x_r(T) = U,
// where x_r(T) = sup{x : t_r(x) <= T} is increasing in T, by bisection; then round the x_r by largest
// remainder so that the shares are integers (multiples of --required-batch-size-multiple where U
// allows), at least 1, and sum to U exactly. The solver is a pure function: every --balance-interval
// updates the ranks gather each other's fits (one small collective) and each computes the same split,
// so they agree without a broadcast.
//
// Hysteresis. A new split is applied only when it is predicted faster than the one in force by more
// than a deadband, so noise does not make the split oscillate: --balance-threshold (Cannikin's 3%),
// widened on a noisy machine to twice the largest relative standard error of a rank's per-sample
// cost over its window (unless --balance-threshold is given). On a shared machine where a rank's updates vary by 20%, a fixed 3% let
// identical ranks wander between 56/72 and 64/64; the measured noise sets the band there, while a
// real change of load (a predicted gain of 20% and more) still passes at the next re-plan.
// LB-BSP and OmniLearn resize every iteration; we re-plan every --balance-interval updates, which keeps
// the collective's cost negligible and the window long enough to average noise out.

// Note [Sitting out]
// ~~~~~~~~~~~~~~~~~~
// A rank's fixed cost a_r is paid in every update it takes part in, however few samples it gets: one forward
// and backward, the reduction, the copies. A rank whose a_r alone is longer than the update the others take
// without it makes every update slower, at any share of at least one sample: an old card beside a fast one,
// or a rank the machine starves. So the solver may give it 0 (where SplitProblem::may_sit_out allows): it
// orders the ranks that may leave by their predicted time for the smallest share (the slowest first, the higher
// rank first among equals) and keeps the best of leaving out the first k of them, k = 0, 1, ...: a prefix, since
// two slow ranks may each hold the update back alone, so that taking out either one gains nothing. The order is
// a pure function of the measurements, so every rank computes the same split. The ranks left
// share U as before; a rank at 0 takes no part in the update at all (Note [Data plan], Note [Sharing an
// update]). What it would cost and save is reported: fixed_s, its predicted time for the smallest share it
// could take, and saves_s, how much shorter the update would be with its samples if that share cost nothing
// fixed (the per-sample speed it brings).
//
// A rank at 0 is not forgotten: it keeps being measured by probe micro-batches off the update's path, and it
// comes back at a re-plan where the solver, given its probes, no longer takes it out.

RankCost fit_rank_cost(const std::vector<std::pair<int64_t, double>>& m) {
  HETSEQ_ASSERT(!m.empty(), "fit_rank_cost without measurements");
  std::set<int64_t> sizes;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [b, t] : m) {
    sizes.insert(b);
    sx += static_cast<double>(b);
    sy += t;
    sxx += static_cast<double>(b) * static_cast<double>(b);
    sxy += static_cast<double>(b) * t;
  }
  const double n = static_cast<double>(m.size());
  RankCost cost;
  const double det = n * sxx - sx * sx;
  // Sizes close together give an intercept that is mostly noise (a 1% error over sizes 64 and 77 moves
  // it by 5% of the step), so the fixed part is fitted only over sizes that span a factor of 2.
  const bool spread = sizes.size() >= 2 && *sizes.rbegin() >= 2 * *sizes.begin();
  if (spread && det > 0) {
    cost.per_sample_s = (n * sxy - sx * sy) / det;
    cost.fixed_s = (sy - cost.per_sample_s * sx) / n;
  }
  if (!spread || cost.per_sample_s <= 0 || cost.fixed_s < 0) {
    // Sizes too close, or a fit that noise made unphysical: proportional through the origin.
    cost.fixed_s = 0;
    cost.per_sample_s = sy / std::max(sx, 1.0);
  }
  return cost;
}

int64_t micro_batches_for(int64_t share, int64_t cap) {
  if (cap <= 0 || share <= cap) return 1;
  return (share + cap - 1) / cap;
}

double predicted_seconds(const RankCost& cost, int64_t share, int64_t cap) {
  if (share == 0) return 0;  // sits out: no part in the update (Note [Sitting out])
  return static_cast<double>(micro_batches_for(share, cap)) * cost.fixed_s +
         cost.per_sample_s * static_cast<double>(share);
}

double predicted_step_seconds(const SplitProblem& p, const std::vector<int64_t>& shares) {
  double worst = 0;
  for (size_t r = 0; r < shares.size(); ++r) worst = std::max(worst, predicted_seconds(p.costs[r], shares[r], p.caps[r]));
  return worst;
}

namespace {

// The largest (real) share rank `cost` finishes within `t` seconds: the sup of x with
// ceil(x / cap) * a + c * x <= t, searched segment by segment of the micro-batch count.
double share_within(const RankCost& cost, int64_t cap, double t, double limit) {
  const double c = std::max(cost.per_sample_s, 1e-15);
  if (cap <= 0) return std::clamp((t - cost.fixed_s) / c, 0.0, limit);
  double best = 0;
  for (int64_t k = 1; static_cast<double>(k - 1) * static_cast<double>(cap) < limit; ++k) {
    const double x = (t - static_cast<double>(k) * cost.fixed_s) / c;
    const double lo = static_cast<double>(k - 1) * static_cast<double>(cap);
    if (x <= lo) break;  // more micro-batches only cost more
    best = std::min(x, static_cast<double>(k) * static_cast<double>(cap));
  }
  return std::min(best, limit);
}

// Integer shares from real ones: `total / unit` whole units of `unit` samples, at least one per rank,
// the rest by largest remainder; what U leaves over a multiple of `unit` goes to the largest
// remainder too. With fewer units than ranks the unit is one sample.
std::vector<int64_t> round_shares(const std::vector<double>& x, int64_t total, int64_t unit) {
  const size_t n = x.size();
  if (total / unit < static_cast<int64_t>(n)) unit = 1;
  const int64_t count = total / unit;
  const int64_t rest = count - static_cast<int64_t>(n);  // units beyond each rank's first
  const double sum = std::accumulate(x.begin(), x.end(), 0.0);
  std::vector<double> beyond(n);  // [rank] units wanted beyond the first
  for (size_t r = 0; r < n; ++r) {
    const double want = sum > 0 ? x[r] / sum * static_cast<double>(count) : static_cast<double>(count) / n;
    beyond[r] = std::max(0.0, want - 1.0);
  }
  const double beyond_sum = std::accumulate(beyond.begin(), beyond.end(), 0.0);
  std::vector<int64_t> out(n, 1);
  std::vector<std::pair<double, size_t>> remainders;  // (remainder, rank)
  int64_t given = 0;
  for (size_t r = 0; r < n; ++r) {
    const double w = beyond_sum > 0 ? beyond[r] / beyond_sum * static_cast<double>(rest)
                                    : static_cast<double>(rest) / static_cast<double>(n);
    const auto whole = static_cast<int64_t>(std::floor(w));
    out[r] += whole;
    given += whole;
    remainders.emplace_back(w - static_cast<double>(whole), r);
  }
  // Largest remainder first; ties go to the lower rank, so every rank computes the same split.
  std::sort(remainders.begin(), remainders.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (size_t i = 0; given < rest; ++i, ++given) ++out[remainders[i % n].second];
  for (auto& share : out) share *= unit;
  out[remainders.front().second] += total - count * unit;
  return out;
}

}  // namespace

namespace {

// The split of `p` among the ranks with `in[r]` true: equal predicted finish times, then rounded; 0 for the
// others. Throws hetseq::UsageError when U is smaller than the ranks taking part.
Split split_among(const SplitProblem& p, const std::vector<bool>& in) {
  const size_t n = p.costs.size();
  std::vector<size_t> ranks;  // the ranks taking part, in order
  for (size_t r = 0; r < n; ++r) {
    if (in[r]) ranks.push_back(r);
  }
  const int64_t total = p.samples_per_update;
  if (total < static_cast<int64_t>(ranks.size())) {
    throw UsageError(fmt::format("balancing: {} samples per update cannot give each of {} ranks one", total,
                                 ranks.size()));
  }
  const double limit = static_cast<double>(total);
  double lo = 0, hi = 0;
  for (size_t r : ranks) hi = std::max(hi, predicted_seconds(p.costs[r], total, p.caps[r]));
  for (int iteration = 0; iteration < 100; ++iteration) {
    const double mid = 0.5 * (lo + hi);
    double sum = 0;
    for (size_t r : ranks) sum += share_within(p.costs[r], p.caps[r], mid, limit);
    (sum >= limit ? hi : lo) = mid;
  }
  std::vector<double> x;
  for (size_t r : ranks) x.push_back(share_within(p.costs[r], p.caps[r], hi, limit));
  const std::vector<int64_t> rounded = round_shares(x, total, std::max<int64_t>(1, p.multiple));
  Split split;
  split.shares.assign(n, 0);
  for (size_t i = 0; i < ranks.size(); ++i) split.shares[ranks[i]] = rounded[i];
  for (size_t r = 0; r < n; ++r) split.micro_batches.push_back(micro_batches_for(split.shares[r], p.caps[r]));
  split.predicted_step_s = predicted_step_seconds(p, split.shares);
  return split;
}

}  // namespace

Split solve_split(const SplitProblem& p) {
  const size_t n = p.costs.size();
  HETSEQ_ASSERT(n > 0 && p.caps.size() == n, "solve_split: {} costs, {} caps", n, p.caps.size());
  HETSEQ_ASSERT(p.may_sit_out.empty() || p.may_sit_out.size() == n, "solve_split: {} sit-out flags for {} ranks",
                p.may_sit_out.size(), n);
  std::vector<bool> in(n, true);
  Split best = split_among(p, in);
  // Note [Sitting out]: the ranks that may leave, slowest at their smallest share first (the higher rank first
  // among equals); the best of leaving out the first k of them, for every k that leaves a rank to train.
  const int64_t unit = std::min(std::max<int64_t>(1, p.multiple), p.samples_per_update);
  std::vector<size_t> leaving;
  for (size_t r = 0; r < n; ++r) {
    if (!p.may_sit_out.empty() && p.may_sit_out[r]) leaving.push_back(r);
  }
  std::stable_sort(leaving.begin(), leaving.end(), [&](size_t a, size_t b) {
    const double ta = predicted_seconds(p.costs[a], unit, p.caps[a]), tb = predicted_seconds(p.costs[b], unit, p.caps[b]);
    return ta != tb ? ta > tb : a > b;
  });
  std::vector<bool> without(n, true);
  for (size_t k = 0; k < leaving.size() && k + 1 < n; ++k) {
    without[leaving[k]] = false;
    Split candidate = split_among(p, without);
    if (candidate.predicted_step_s < best.predicted_step_s * (1 - 1e-9)) {
      best = std::move(candidate);
      in = without;
    }
  }
  for (size_t r = 0; r < n; ++r) {
    if (in[r]) continue;
    SitOut why;
    why.rank = static_cast<int64_t>(r);
    why.fixed_s = predicted_seconds(p.costs[r], unit, p.caps[r]);
    // Its samples at its per-sample speed, with no fixed cost: what the others would be spared.
    SplitProblem free_fixed = p;
    free_fixed.costs[r].fixed_s = 0;
    std::vector<bool> with = in;
    with[r] = true;
    why.saves_s = std::max(0.0, best.predicted_step_s - split_among(free_fixed, with).predicted_step_s);
    best.sat_out.push_back(why);
  }
  return best;
}

bool worth_switching(const SplitProblem& p, const std::vector<int64_t>& current, const Split& proposed,
                     double threshold) {
  if (current == proposed.shares) return false;
  const double now = predicted_step_seconds(p, current);
  return proposed.predicted_step_s < now * (1.0 - threshold);
}

}  // namespace hetseq
