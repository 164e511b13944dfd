#pragma once

#include <cstdint>
#include <vector>

#include "hetseq/data/data_plan.h"

namespace hetseq {

/// How an epoch's order is drawn.
struct EpochIteratorOptions {
  uint64_t seed = 1;       // --seed: the permutation of epoch e is drawn from (seed, e)
  int64_t curriculum = 0;  // --curriculum: epochs 1..curriculum keep the dataset order
  bool shuffle = true;     // false for validation
  /// The words of the iterator's messages (Note [Options in the user's words]): the flags, or hetseq.data.Plan's
  /// arguments.
  Naming naming = Naming::kFlags;
};

/// Where an iterator stands: the epoch (1-based) and the number of samples of that epoch's
/// permutation that completed updates consumed. See Note [Data plan].
struct IteratorPosition {
  int64_t epoch = 1;
  int64_t offset = 0;
  bool operator==(const IteratorPosition& o) const { return epoch == o.epoch && offset == o.offset; }
};

/// Hands out, update by update, the sample indices of this rank's micro-batches, following the data
/// plan (see Note [Data plan]). The order depends only on the seed, the epoch and the plan.
class EpochBatchIterator {
 public:
  EpochBatchIterator(int64_t dataset_size, DataPlan plan, EpochIteratorOptions options);

  /// Starts `epoch` (1-based) at its first sample. After restore(), the restored epoch starts at the
  /// restored offset instead.
  void begin_epoch(int64_t epoch);
  /// True when this epoch's samples are all handed out (or no epoch has begun).
  bool end_of_epoch() const;
  /// This rank's micro-batches of the next update: [micro-batch][sample index], always
  /// update_freqs[rank] entries, some of them short or empty at the end of the epoch.
  std::vector<std::vector<int64_t>> next_update();

  /// Updates left in the current epoch, the same on every rank.
  int64_t updates_left() const;
  /// Updates in a whole epoch under the current plan.
  int64_t updates_per_epoch() const;
  int64_t epoch() const { return position_.epoch; }
  int64_t dataset_size() const { return dataset_size_; }

  IteratorPosition position() const { return position_; }
  /// Continues from `position` at the next begin_epoch(position.epoch), or at once when that epoch
  /// is the current one. Throws hetseq::InputError when the offset lies outside the dataset.
  void restore(IteratorPosition position);

  const DataPlan& plan() const { return plan_; }
  /// Replaces the plan (other batch sizes, update frequencies or ranks) between updates; the
  /// position in the permutation is kept.
  void set_plan(DataPlan plan);

  /// The order of `epoch`: a permutation of 0..dataset_size-1 (identity without shuffling).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  int64_t dataset_size_;
  DataPlan plan_;
  EpochIteratorOptions options_;
  IteratorPosition position_;
  bool restored_ = false;
  bool started_ = false;
  std::vector<int64_t> order_;  // [position in epoch] sample index
};

}  // namespace hetseq
