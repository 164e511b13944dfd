#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hetseq/checkpoint/checkpoint.h"
#include "hetseq/checkpoint/save_options.h"

namespace hetseq {

/// Where a checkpoint is taken: at the end of an epoch, or inside one (every --save-interval-updates
/// updates, or when training stops at --max-update).
struct SavePoint {
  int64_t epoch = 1;        // the epoch that was being trained
  int64_t num_updates = 0;
  bool end_of_epoch = false;
  std::optional<double> metric;  // the validation value of --best-checkpoint-metric, when validation ran
};

/// Decides which files a save writes (checkpoint_last.pt, checkpoint{epoch}.pt,
/// checkpoint_{epoch}_{updates}.pt, checkpoint_best.pt), writes them from one encoding, applies the
/// retention flags and tracks the best metric. It knows files and flags only, no ranks and no
/// Controller: the Checkpointer (hetseq/train/checkpointer.h) runs a save across the ranks and asks
/// it. Only one rank (rank 0) writes through it.
class CheckpointManager {
 public:
  explicit CheckpointManager(CheckpointSaveOptions options);

  /// Whether an update count that is not the end of an epoch takes a checkpoint.
  bool save_due_after_update(int64_t num_updates) const;
  /// Whether the end of `epoch` takes a checkpoint.
  bool save_due_after_epoch(int64_t epoch) const;

  /// The best metric so far (restored from a checkpoint, updated by record_metric).
  std::optional<double> best() const { return best_; }
  void set_best(std::optional<double> best) { best_ = best; }
  /// Whether `value` beats the best so far (lower is better unless maximizing); a tie is not better.
  bool is_better(double value) const;

  /// The files a save at `point` writes, in --save-dir (empty with --no-save). Call before record().
  std::vector<std::filesystem::path> files_for(const SavePoint& point) const;
  /// Updates the best metric from `point` (call before capturing the state to save, so that the
  /// file records the new best).
  void record(const SavePoint& point);
  /// Writes `checkpoint` to `files` (from files_for) and then removes what the retention flags
  /// (--keep-interval-updates, --keep-last-epochs) no longer keep, with their optimizer shard files and
  /// manifests, and the shard sets of `files` that `checkpoint` does not reference. Returns the files
  /// that the retention flags removed.
  std::vector<std::filesystem::path> write(const Checkpoint& checkpoint, const std::vector<std::filesystem::path>& files);

  const CheckpointSaveOptions& options() const { return options_; }

 private:
  std::vector<std::filesystem::path> prune() const;

  CheckpointSaveOptions options_;
  std::optional<double> best_;
};

}  // namespace hetseq
