#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hetseq/checkpoint/checkpoint.h"

namespace hetseq {

/// When and where checkpoints are written, with HetSeq's flags and file names.
struct CheckpointSaveOptions {
  std::string save_dir = "checkpoints";   // --save-dir
  bool no_save = false;                   // --no-save: write nothing
  int64_t save_interval = 1;              // --save-interval: checkpoint{epoch}.pt every N epochs
  int64_t save_interval_updates = 0;      // --save-interval-updates: checkpoint_{epoch}_{updates}.pt every N updates
  int64_t keep_interval_updates = -1;     // --keep-interval-updates: keep the newest N of those (-1: all)
  int64_t keep_last_epochs = -1;          // --keep-last-epochs: keep the newest N checkpoint{epoch}.pt (-1: all)
  bool no_epoch_checkpoints = false;      // --no-epoch-checkpoints
  bool no_last_checkpoints = false;       // --no-last-checkpoints
  bool no_save_optimizer_state = false;   // --no-save-optimizer-state
  std::string best_checkpoint_metric = "loss";  // --best-checkpoint-metric (a validation statistic)
  bool maximize_best_checkpoint_metric = false;  // --maximize-best-checkpoint-metric
};

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
/// retention flags and tracks the best metric. Only one rank (rank 0) saves.
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
