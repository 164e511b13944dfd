#pragma once
// The names of a sharded checkpoint's shard files and manifests beside the checkpoint, and their
// removal with it (retention, CheckpointManager). What the files hold, and the protocol that writes and
// reads them, are the sharding module's (hetseq/shard/optimizer_shards.h, sharded_save.h). See Note
// [Sharded optimizer state in checkpoints] (hetseq/shard/sharded_save.cpp).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace hetseq {

/// `dir/checkpoint_last.<save id>.shard-<rank>-of-<world size>.pt` for `checkpoint` = dir/checkpoint_last.pt.
std::filesystem::path shard_file_path(const std::filesystem::path& checkpoint, const std::string& save_id,
                                      int64_t rank, int64_t world_size);
/// `dir/checkpoint_last.<save id>.manifest.json` for `checkpoint` = dir/checkpoint_last.pt.
std::filesystem::path manifest_path(const std::filesystem::path& checkpoint, const std::string& save_id);

/// Removes the shard files and manifests beside `checkpoint` of every save but `keep` (all of them when
/// `keep` is empty): the retention of a removed checkpoint, the older sets of a rewritten one, and what a
/// killed save left. Returns the removed files.
std::vector<std::filesystem::path> remove_shard_sets(const std::filesystem::path& checkpoint,
                                                     const std::string& keep = "");

/// Removes the shard files and manifests in `dir` whose checkpoint (the name before ".<save id>.") is not
/// there: what a save killed before its checkpoint's rename left under a name that is never written again
/// (an interval checkpoint), or a prune killed between the checkpoint and its shards. Rank 0 calls it at
/// start, before any save. Returns the removed files.
std::vector<std::filesystem::path> remove_orphan_shard_sets(const std::filesystem::path& dir);

}  // namespace hetseq
