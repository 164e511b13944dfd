#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

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
/// it, listed by its manifest (hetseq/checkpoint/optimizer_shards.h). See Note [Sharded optimizer state
/// in checkpoints] (hetseq/train/sharded_optimizer.cpp).
struct OptimizerShardsRef {
  std::string save_id;     // the save's id, also in the manifest and every shard file
  int64_t world_size = 0;  // shard files: one per rank
};

/// Everything a training run needs to continue exactly where it stopped: the Controller's
/// TrainingState and where the data stands. See Note [Checkpoint file].
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
  std::string model_digest;       // parameter names and shapes (hetseq/distributed/handshake.h)
  std::string options;            // the compared flags (Note [Compared flags]), for the record
  std::string torch_version;      // of the LibTorch that wrote the file
  int64_t format_version = kFormatVersion;
};

/// Copies `tensors` (from model_tensors) into `model`'s parameters and buffers. Throws
/// hetseq::InputError naming `source` (the file) on a missing or extra name or a shape mismatch.
void load_model_tensors(torch::nn::Module& model, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::string& source);

/// The file's bytes: a torch.save-compatible archive (readable with torch.load in Python) whose
/// `checksum` entry covers every other entry. See Note [Checkpoint file]. Built in memory, with a CPU
/// copy of every tensor that is not a contiguous CPU tensor (tests and tools); save_checkpoint writes
/// the same bytes without holding them.
std::vector<char> encode_checkpoint(const Checkpoint& checkpoint);

/// Parses and verifies bytes written by encode_checkpoint. Throws hetseq::InputError naming `source`
/// when the bytes are truncated, altered (checksum), of another format version, or incomplete.
Checkpoint decode_checkpoint(const std::vector<char>& bytes, const std::string& source);

/// A digest of the training state (model, optimizer, LR scheduler, update count and position; not the
/// meters or RNG), as readable text: ranks that resumed compare it (see check_ranks_agree).
std::string state_digest(const Checkpoint& checkpoint);

/// Throws hetseq::InputError naming `source` when the checkpoint was written by another task or for
/// a model of other parameter names or shapes.
void check_checkpoint_fits(const Checkpoint& checkpoint, const std::string& task, const std::string& model_digest,
                           const std::string& source);

/// Writes the bytes of encode_checkpoint to each of `paths` atomically (see write_file_atomically):
/// streamed into the first file tensor by tensor, taking at most one tensor's copy of host memory
/// (Note [Streamed save]), then copied to the others. Throws hetseq::InputError naming the file that
/// could not be written; files already written stay.
void save_checkpoint(const Checkpoint& checkpoint, const std::vector<std::filesystem::path>& paths);

/// Reads and verifies a checkpoint file. Throws hetseq::InputError naming the file.
Checkpoint load_checkpoint(const std::filesystem::path& path);

/// Loads only the model weights of a checkpoint file into `model` (hetseq-eval, tests).
void load_model(torch::nn::Module& model, const std::filesystem::path& path);

}  // namespace hetseq
