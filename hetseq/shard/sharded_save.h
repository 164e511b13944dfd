#pragma once
/// One sharded save: every rank's shard file of the optimizer state beside the checkpoint, and rank 0's
/// manifests. See Note [Sharded optimizer state in checkpoints].

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hetseq/checkpoint/checkpoint.h"
#include "hetseq/world/save_fence.h"
#include "hetseq/optim/optimizer.h"
#include "hetseq/shard/optimizer_shards.h"

namespace hetseq {

/// The sharding's part of a checkpoint save at one save point, through the save fence. The Checkpointer
/// runs it when the Controller's ShardingStrategy gives a state_piece(): announce() on every rank; then
/// write_part() on every rank but 0; then, inside the fence's run(), write_sets() on rank 0 before it
/// writes the checkpoint itself with ref().
class ShardedSave {
 public:
  /// A collective through the fence at the save point `id`: rank 0 draws the save id and shares it with
  /// the first of `files` (the names the checkpoint is written under: rank 0's; ignored on the others).
  static ShardedSave announce(SaveFence& fence, int64_t id, int64_t rank, int64_t world_size,
                              const std::vector<std::filesystem::path>& files);

  /// No file is due at this save point (every rank learnt it from rank 0).
  bool empty() const { return save_id_.empty(); }
  /// What the checkpoint records of its shard files.
  OptimizerShardsRef ref() const { return OptimizerShardsRef{save_id_, world_size_}; }
  const std::string& save_id() const { return save_id_; }

  /// Every rank but 0: writes its shard file under a heartbeat of its own and posts its entry to rank 0
  /// (SaveFence::write_part; Note [Lost writers]). Throws what the write throws, after posting it.
  void write_part(const optim::StatePiece& piece);
  /// Rank 0, inside the fence's run(): writes its own shard file, collects every other rank's entry, copies
  /// the shard files for the other names in `files` and writes one manifest per name. Throws
  /// hetseq::InputError naming the rank whose shard could not be written, or the file.
  void write_sets(const optim::StatePiece& piece, const std::vector<std::filesystem::path>& files,
                  int64_t num_updates);

 private:
  ShardedSave(SaveFence& fence, int64_t id, int64_t rank, int64_t world_size, std::string save_id,
              std::filesystem::path first);
  ShardFileEntry write_own(const optim::StatePiece& piece) const;

  SaveFence* fence_;
  int64_t id_;
  int64_t rank_;
  int64_t world_size_;
  std::string save_id_;          // empty: nothing due
  std::filesystem::path first_;  // the first name's checkpoint, whose shard files the ranks write
};

}  // namespace hetseq
