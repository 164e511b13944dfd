#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace hetseq {

/// A rank's measured compute cost of one micro-batch: seconds = fixed_s + per_sample_s * samples.
/// See Note [Balancing].
struct RankCost {
  double fixed_s = 0;       // per micro-batch (launch, optimizer-independent overheads)
  double per_sample_s = 0;  // per sample
};

/// Fits a RankCost by least squares to (micro-batch size, seconds) measurements. Unless the sizes span
/// a factor of 2 the fixed part cannot be told apart from noise and the fit is proportional
/// (fixed_s = 0).
/// Throws hetseq::InternalError when there is no measurement.
RankCost fit_rank_cost(const std::vector<std::pair<int64_t, double>>& measurements);

/// What the split of one update must respect.
struct SplitProblem {
  int64_t samples_per_update = 0;  // U: the samples of one update over all ranks, kept exactly
  std::vector<RankCost> costs;     // [rank]
  std::vector<int64_t> caps;       // [rank] largest micro-batch that fits in memory (0: no limit)
  int64_t multiple = 1;            // --required-batch-size-multiple
  /// [rank] whether the rank may be given no samples at all (Note [Sitting out]); empty: none may.
  std::vector<bool> may_sit_out;
};

/// Why a rank was given no samples: what taking part would cost, against what its samples would save.
struct SitOut {
  int64_t rank = 0;
  double fixed_s = 0;  // its predicted seconds for the smallest share it could take
  double saves_s = 0;  // how much faster the update would be with its samples, were that share free
};

/// A split of one update: each rank's share of the U samples, cut into micro-batches of at most its
/// cap (accumulated without sync, as with --update-freq).
struct Split {
  std::vector<int64_t> shares;         // [rank] samples per update; they sum to U
  std::vector<int64_t> micro_batches;  // [rank] ceil(share / cap), 1 without a cap
  double predicted_step_s = 0;         // the slowest rank's predicted compute time
  std::vector<SitOut> sat_out;         // the ranks with a share of 0, in rank order
};

/// Micro-batches of a share under a cap (0: no cap).
int64_t micro_batches_for(int64_t share, int64_t cap);
/// Predicted compute seconds of a rank for `share` samples: micro_batches * fixed_s + per_sample_s * share.
double predicted_seconds(const RankCost& cost, int64_t share, int64_t cap);
/// The slowest rank's predicted seconds under `shares` [rank].
double predicted_step_seconds(const SplitProblem& problem, const std::vector<int64_t>& shares);

/// The split with equal predicted finish times: every share at least 1, rounded by largest remainder
/// to multiples of `multiple` where U allows, summing to U exactly; except that a rank that may sit out
/// gets 0 where the update is predicted faster without it (Note [Sitting out]). A pure function of its
/// input, so ranks that hold the same (all-gathered) measurements compute the same split. Throws
/// hetseq::UsageError when U is smaller than the number of ranks that take part.
Split solve_split(const SplitProblem& problem);

/// Hysteresis: whether `proposed` is predicted to be faster than `current` [rank] by more than
/// `threshold` (a share of the current step time, e.g. 0.05), so that noise does not move the split.
bool worth_switching(const SplitProblem& problem, const std::vector<int64_t>& current, const Split& proposed,
                     double threshold);

}  // namespace hetseq
