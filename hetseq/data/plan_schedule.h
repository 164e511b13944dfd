#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "hetseq/data/data_plan.h"

namespace hetseq {

/// The data plans of a whole run, as every rank holds them after the start handshake: each rank's
/// micro-batch size (which may change between two updates), its per-epoch update-freqs
/// (--update-freq lists) and its validation batch size. See Note [Data plan] and Note [Plan schedule].
class PlanSchedule {
 public:
  /// `batch_sizes` [rank], `update_freqs` [rank][epoch] (the last value holds for later epochs),
  /// `valid_batch_sizes` [rank]; `rank` is this process's. Throws hetseq::UsageError on sizes that do
  /// not agree or values that are not positive.
  PlanSchedule(std::vector<int64_t> batch_sizes, std::vector<std::vector<int64_t>> update_freqs,
               std::vector<int64_t> valid_batch_sizes, int64_t rank);

  /// The training plan of `epoch` (1-based) with the current batch sizes.
  DataPlan train_plan(int64_t epoch) const;
  /// The validation plan: every rank one micro-batch of its validation batch size per step.
  DataPlan valid_plan() const;
  /// The validation plan at the end of (or inside) `epoch`: under a balanced split, the samples of a
  /// validation step cut in proportion to the training shares (a rank that sits out validates nothing), in
  /// micro-batches no larger than each rank's validation batch size; else valid_plan(). See Note [Validating
  /// a balanced split].
  DataPlan valid_plan(int64_t epoch) const;

  /// Changes the per-rank split of every update from the next one on, keeping the samples per
  /// update of `epoch`: `batch_sizes` [rank] and `update_freqs` [rank] of the epoch being trained.
  /// Throws hetseq::UsageError when the total differs (the steps would then be other samples).
  /// See Note [Plan schedule].
  void set_split(int64_t epoch, std::vector<int64_t> batch_sizes, std::vector<int64_t> update_freqs);
  /// The same for a balanced split: rank r takes `shares[r]` samples per update in `micro_batches[r]`
  /// micro-batches (Note [Data plan]). Throws hetseq::UsageError as set_split does.
  void set_shares(int64_t epoch, std::vector<int64_t> shares, std::vector<int64_t> micro_batches);
  /// Counts the changes made by set_split, so that a reader can tell that its plan is stale.
  int64_t version() const { return version_; }

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return static_cast<int64_t>(batch_sizes_.size()); }
  /// Micro-batches per update over all ranks in `epoch` (the fp16 scale window's unit).
  int64_t micro_batches_per_update(int64_t epoch) const;

 private:
  DataPlan configured(int64_t epoch) const;
  void apply(int64_t epoch, DataPlan after);

  std::vector<int64_t> batch_sizes_;                // [rank] as configured (--max-sentences)
  std::vector<std::vector<int64_t>> update_freqs_;  // [rank][epoch] as configured (--update-freq)
  std::optional<DataPlan> split_;                   // the last set_split, while its total holds
  std::vector<int64_t> valid_batch_sizes_;          // [rank]
  int64_t rank_ = 0;
  int64_t version_ = 0;
};

}  // namespace hetseq
