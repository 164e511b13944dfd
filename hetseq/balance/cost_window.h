#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "hetseq/balance/split_solver.h"

namespace hetseq {

/// One update's compute on one rank: its samples, cut into `micro_batches`, took `seconds` (data wait,
/// forward and backward, without the wait in collectives). See Note [Balancing].
struct CostSample {
  int64_t samples = 0;
  int64_t micro_batches = 1;
  double seconds = 0;
};

/// The last `capacity` measurements of one rank, smoothed into a RankCost: a least-squares fit of the
/// time per micro-batch against the micro-batch size, over the sizes the rank has actually run.
class CostWindow {
 public:
  explicit CostWindow(size_t capacity) : capacity_(capacity) {}

  /// Adds a measurement; the oldest goes when the window is full. Ignores one without samples.
  void add(const CostSample& sample);
  void clear() { samples_.clear(); }
  size_t size() const { return samples_.size(); }
  bool empty() const { return samples_.empty(); }

  /// The fitted cost (fit_rank_cost over the per-micro-batch points). Throws hetseq::InternalError
  /// when the window is empty.
  RankCost fit() const;
  /// Seconds per sample over the window, fixed costs included (0 when empty).
  double seconds_per_sample() const;
  /// The standard error of the mean seconds per sample, relative to that mean: how far noise alone
  /// may move this rank's estimate (0 with fewer than two measurements).
  double relative_error() const;

 private:
  size_t capacity_;
  std::deque<CostSample> samples_;
};

}  // namespace hetseq
