#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "hetseq/checkpoint/checkpoint_manager.h"
#include "hetseq/data/data_plan.h"
#include "hetseq/data/epoch_batch_iterator.h"
#include "hetseq/world/save_fence.h"
#include "hetseq/train/controller.h"

namespace hetseq {

/// What the Checkpointer records besides the training state.
struct CheckpointerOptions {
  CheckpointSaveOptions save;  // --save-dir, intervals, retention, best metric
  int64_t rank = 0;            // rank 0 writes the checkpoint; with --zero-sharding os each rank its shard
  int64_t world_size = 1;
  std::string task;            // --task
  std::string model_digest;    // see model_digest()
  std::string options;         // the compared flags, as text, for the record
  /// Distributed runs: every rank passes it at each save while rank 0 writes (Note [Checkpoint fence]);
  /// null for one process.
  std::shared_ptr<SaveFence> fence;
};

/// A save across the ranks, in one call: it takes the Controller's state, gathers the comm hook's state
/// to rank 0, runs the checkpoint fence, and logs the save. Every rank calls save() at the same points
/// (so that they agree on when the last save was); rank 0 writes, and where the Controller's
/// ShardingStrategy keeps the optimizer state in shards (--zero-sharding os) every rank writes its shard
/// first, through a ShardedSave (Note [Sharded optimizer state in checkpoints]).
/// Which files a save writes, the best metric and the retention flags are its CheckpointManager's.
class Checkpointer {
 public:
  Checkpointer(CheckpointerOptions options, std::optional<double> best);

  /// Whether an update count inside an epoch (--save-interval-updates) takes a checkpoint.
  bool due_after_update(int64_t num_updates) const;
  /// Whether the end of `epoch` (--save-interval) takes a checkpoint.
  bool due_after_epoch(int64_t epoch) const;
  /// Whether a save at the current update count would write something new.
  bool saved_at(int64_t num_updates) const { return last_saved_ == num_updates; }
  bool enabled() const { return !options_.save.no_save; }

  /// Saves the training state of `controller` at `point`; `next` is where training continues and
  /// `plan` the data plan of the epoch being trained. Every rank calls it: it gathers the comm hook's
  /// state to rank 0 (Controller::gather_comm_hook_state) before rank 0 writes. Throws
  /// hetseq::InputError naming the file that could not be written (on every rank, through the fence).
  void save(Controller& controller, const SavePoint& point, IteratorPosition next, const DataPlan& plan);
  /// The checkpoint that a save now would write (the ranks compare its digest at start).
  Checkpoint snapshot(Controller& controller, IteratorPosition next, const DataPlan& plan) const;

 private:
  void save_sharded(Controller& controller, const SavePoint& point, IteratorPosition next, const DataPlan& plan,
                    std::optional<PowerSgdState> comm_hook_state, const optim::StatePiece& piece);

  CheckpointerOptions options_;
  CheckpointManager manager_;
  int64_t last_saved_ = -1;  // num_updates of the last save
};

}  // namespace hetseq
