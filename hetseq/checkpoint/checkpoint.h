#pragma once
// What a checkpoint holds, as one value. Its file's bytes: checkpoint_format.h; files on disk:
// checkpoint_file.h; the checks on resume: resume_check.h; which files a save writes: checkpoint_manager.h.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hetseq/checkpoint/training_state.h"

namespace hetseq {

/// The data plan a checkpoint was written under (see Note [Data plan]): on resume it is compared with
/// the new one, which may differ (another cluster).
struct SavedDataPlan {
  std::vector<int64_t> batch_sizes;   // [rank]
  std::vector<int64_t> update_freqs;  // [rank], for the epoch being trained
  std::vector<int64_t> shares;        // [rank] samples per update (a balanced split); empty: b * u
  bool operator==(const SavedDataPlan& o) const {
    return batch_sizes == o.batch_sizes && update_freqs == o.update_freqs && shares == o.shares;
  }
};

/// Where a sharded checkpoint (--zero-sharding os) keeps the optimizer's buffers: in shard files beside
/// it, listed by its manifest (hetseq/shard/optimizer_shards.h). See Note [Sharded optimizer state
/// in checkpoints] (hetseq/shard/sharded_save.cpp).
struct OptimizerShardsRef {
  std::string save_id;     // the save's id, also in the manifest and every shard file
  int64_t world_size = 0;  // shard files: one per rank
};

/// Everything a training run needs to continue exactly where it stopped: the Controller's
/// TrainingState and where the data stands. See Note [Checkpoint file] (checkpoint_format.cpp).
struct Checkpoint : TrainingState {
  static constexpr int64_t kFormatVersion = 1;
  /// A checkpoint whose optimizer buffers are in shard files: a build that reads only version 1 refuses
  /// it instead of resuming with the optimizer's moments silently reset. Ordinary checkpoints stay 1.
  static constexpr int64_t kShardedFormatVersion = 2;

  int64_t epoch = 1;   // the epoch of the next update
  int64_t offset = 0;  // samples of that epoch's permutation already consumed
  std::optional<double> best;            // best --best-checkpoint-metric so far
  SavedDataPlan data_plan;
  /// Set when the optimizer's buffers are in shard files (optimizer_state then holds its other entries).
  std::optional<OptimizerShardsRef> optimizer_shards;

  std::string task;               // --task
  std::string model_digest;       // parameter names and shapes (hetseq/world/handshake.h)
  std::string options;            // the compared flags (Note [Compared flags]), for the record
  std::string torch_version;      // of the LibTorch that wrote the file
  int64_t format_version = kFormatVersion;
};

}  // namespace hetseq
