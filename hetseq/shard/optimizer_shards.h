#pragma once
// A sharded checkpoint's optimizer state: one shard file per rank beside the checkpoint, and the
// manifest that lists them; their names are hetseq/checkpoint/shard_files.h's. See Note [Sharded
// optimizer state in checkpoints] (hetseq/shard/sharded_save.cpp).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hetseq/checkpoint/checkpoint.h"
#include "hetseq/checkpoint/shard_files.h"
#include "hetseq/optim/optimizer.h"

namespace hetseq {

/// One rank's shard file as the manifest lists it.
struct ShardFileEntry {
  int64_t rank = 0;
  int64_t first = 0;   // its elements [first, first + numel) of the flat parameter space
  int64_t numel = 0;
  std::string file;    // its name, in the checkpoint's directory
  int64_t bytes = 0;   // the file's size
  uint32_t crc32 = 0;  // CRC-32 of the file's bytes
};

/// `<checkpoint>.<save id>.manifest.json`: the shard files of one save of one checkpoint name, written
/// once every shard file is durably written and before the checkpoint itself.
struct ShardManifest {
  static constexpr int64_t kFormatVersion = 1;
  std::string save_id;
  std::string checkpoint;  // the checkpoint's file name (checkpoint_last.pt)
  int64_t num_updates = 0;
  int64_t world_size = 0;
  int64_t total_numel = 0;             // the flat space: every parameter's elements
  std::vector<ShardFileEntry> shards;  // [rank], covering [0, total_numel) in order
};

/// A new save id: 16 random hexadecimal digits.
std::string new_save_id();

/// Writes `piece` (this rank's part of the optimizer state) to `path` atomically (write_file_atomically),
/// streamed tensor by tensor, in torch.save's format. Returns its manifest entry (the file's name, size
/// and CRC-32). Throws hetseq::InputError naming the file when it cannot be written.
ShardFileEntry write_optimizer_shard(const optim::StatePiece& piece, const std::string& save_id, int64_t rank,
                                     int64_t world_size, const std::filesystem::path& path);

/// Writes `manifest` to `path` atomically, as JSON. Throws hetseq::InputError naming the file.
void write_manifest(const ShardManifest& manifest, const std::filesystem::path& path);
/// Reads a manifest. Throws hetseq::InputError naming the file when it is missing or not a manifest.
ShardManifest read_manifest(const std::filesystem::path& path);

/// The optimizer buffers of a sharded checkpoint, checked: read by range from its shard files, so that a
/// rank reads the files its new shard overlaps, one at a time (the re-cut of a resume).
class OptimizerShards final : public optim::StateSource {
 public:
  /// Reads the manifest of `checkpoint`'s save `ref` and checks that it belongs to it (the same save
  /// id, world size and update count) and that every shard file it lists exists with its size and
  /// CRC-32 (each file is read once, a MiB at a time). Throws hetseq::InputError naming the manifest or
  /// the shard file, in one line.
  static std::shared_ptr<const OptimizerShards> open(const std::filesystem::path& checkpoint,
                                                     const OptimizerShardsRef& ref, int64_t num_updates);

  optim::StatePiece read_range(int64_t first, int64_t numel, const std::vector<int64_t>& param_numels) const override;

  const ShardManifest& manifest() const { return manifest_; }

 private:
  OptimizerShards(std::filesystem::path checkpoint, std::filesystem::path manifest_file, ShardManifest manifest);
  /// Shard file `rank`'s state, checked again against the manifest.
  std::map<std::string, torch::Tensor> read_shard(size_t rank) const;

  std::filesystem::path checkpoint_;
  std::filesystem::path manifest_file_;
  ShardManifest manifest_;
};

}  // namespace hetseq
