#pragma once
/// When and where checkpoints are written: the CheckpointManager's options, apart from its class.

#include <cstdint>
#include <string>

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

}  // namespace hetseq
