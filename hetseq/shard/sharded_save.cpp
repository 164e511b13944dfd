#include "hetseq/shard/sharded_save.h"

#include <sstream>

#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/checkpoint/shard_files.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {
namespace fs = std::filesystem;

// Note [Sharded optimizer state in checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under --zero-sharding os no rank holds the whole optimizer state, at a save or at a resume. For a
// checkpoint name N.pt (checkpoint_last.pt, checkpoint_best.pt, checkpoint{E}.pt, checkpoint_{E}_{U}.pt)
// a save writes, in --save-dir:
//
//   N.<id>.shard-<r>-of-<W>.pt  rank r's state_piece(): "param.{i}.step" and "param.{i}.{buffer}" (1-D,
//                               parameter i's elements in the rank's range [first, first + numel) of the
//                               flat space), with save id, rank, W, first and numel (torch.save format)
//   N.<id>.manifest.json        save id, N, update count, W, total elements, and per rank: first, numel,
//                               the shard file's name, size and CRC-32
//   N.pt                        the whole model and every other entry as before; its optimizer state has
//                               lr, num_steps and num_params, and `shards` {save_id, world_size}
//
// <id> is 16 random hex digits drawn by rank 0 at each save. The order (ShardedSave, which
// Checkpointer::save runs when the Controller's ShardingStrategy gives a state_piece()):
// rank 0 picks the names and the id and shares them through the store (SaveFence::share); every rank
// but 0 writes its shard for the first name (write temp, fsync, rename, fsync the directory) and posts
// its entry, under a heartbeat of its own (SaveFence::write_part, Note [Lost writers]); inside the
// checkpoint fence (Note [Checkpoint fence]), under its heartbeat, rank 0 writes its own, collects every
// entry (SaveFence::collect), copies the shards for the other names, writes one manifest per name, and
// writes N.pt last. N.pt's rename is the commit: until it happens N.pt is the previous save's, whose
// shards and manifest carry the previous id in their names and were not touched, so a process killed at
// any point leaves the previous checkpoint loadable (only one rename can be atomic; that is why the id
// is in the names rather than a manifest of fixed name being renamed over the old one). Afterwards rank
// 0 removes every other shard set of the names it wrote (earlier saves, and what a killed save left);
// the retention flags remove a checkpoint's shard sets with it (CheckpointManager, remove_shard_sets),
// and at start rank 0 removes the sets whose N.pt is not there (remove_orphan_shard_sets: a save killed
// under a name never written again, such as an interval checkpoint's). The fence's store keys are per
// save point, not per update count (Note [Checkpoint fence]): fp16 can skip every update between two.
// A rank whose shard cannot be written posts its error, and every rank fails with it through the fence.
//
// Load (TrainSession::build_model, on every rank, before anything is written): N.pt names its save id;
// OptimizerShards::open reads N.<id>.manifest.json, checks that its save id, world size and update count
// are N.pt's and that every shard file exists with the listed size and CRC-32 (streamed, a MiB at a
// time), and stops with one line naming the manifest or the shard file otherwise (an input error: exit
// code 3). The strategy then reads its range (ShardingStrategy::load_state, StateSource::read_range):
// `os` its own shard of the new plan, which may span several old shard files, read one at a time and
// cut to the overlaps; `none` the whole range. So a sharded checkpoint resumes on another world size,
// other budgets or --zero-sharding none, and an ordinary checkpoint (full-size buffers in N.pt,
// from none or from an older hetseq that gathered the shards) loads into os as before (load_state
// narrows it). Peak memory: at a save the rank's own shard (it is streamed from the live buffers); at a
// resume its new shard plus one old shard file. The ranks' resume check compares model, schedule and
// position; each rank's shard was checked against the manifest. Nothing gathers the whole state (the
// tests do, with their own helper: tests/support/sharded_state.h).


ShardedSave::ShardedSave(SaveFence& fence, int64_t id, int64_t rank, int64_t world_size, std::string save_id,
                         fs::path first)
    : fence_(&fence), id_(id), rank_(rank), world_size_(world_size), save_id_(std::move(save_id)),
      first_(std::move(first)) {}

ShardedSave ShardedSave::announce(SaveFence& fence, int64_t id, int64_t rank, int64_t world_size,
                                  const std::vector<fs::path>& files) {
  // Rank 0 decides the files (the best metric is its own) and the save id; every rank learns them.
  std::string announce;
  if (rank == 0 && !files.empty()) announce = new_save_id() + " " + files.front().string();
  announce = fence.share(id, announce);
  if (announce.empty()) return ShardedSave(fence, id, rank, world_size, "", "");
  const size_t space = announce.find(' ');
  return ShardedSave(fence, id, rank, world_size, announce.substr(0, space), announce.substr(space + 1));
}

ShardFileEntry ShardedSave::write_own(const optim::StatePiece& piece) const {
  return write_optimizer_shard(piece, save_id_, rank_, world_size_,
                               shard_file_path(first_, save_id_, rank_, world_size_));
}

// 1. Every rank writes its own shard, for the first file's name; rank 0 inside the fence's run() (in
// write_sets), so that its heartbeat covers that write too (the others wait in run() meanwhile, and give
// up after --distributed-timeout without a beat). The others beat a heartbeat of their own meanwhile, so
// that rank 0 tells one that died from one that writes slowly (Note [Lost writers]).
void ShardedSave::write_part(const optim::StatePiece& piece) {
  HETSEQ_ASSERT(rank_ != 0 && !empty(), "write_part on rank {} of save '{}'", rank_, save_id_);
  fence_->write_part(id_, [&] {
    const ShardFileEntry mine = write_own(piece);
    return fmt::format("ok {} {} {} {} {}", mine.first, mine.numel, mine.bytes, mine.crc32, mine.file);
  });
}

// 2. Rank 0, once every shard is written: the copies for the other names and a manifest per name; the
// Checkpointer then writes the checkpoint itself last, whose rename commits the save.
void ShardedSave::write_sets(const optim::StatePiece& piece, const std::vector<fs::path>& files, int64_t num_updates) {
  HETSEQ_ASSERT(rank_ == 0 && !empty(), "write_sets on rank {} of save '{}'", rank_, save_id_);
  std::vector<ShardFileEntry> shards{write_own(piece)};  // [rank]
  const std::vector<std::string> records = fence_->collect(id_);
  for (int64_t r = 1; r < world_size_; ++r) {
    const std::string& text = records[static_cast<size_t>(r)];
    if (text.rfind("ok ", 0) != 0) {
      throw InputError(fmt::format("rank {} could not write its optimizer shard: {}", r,
                                   text.rfind("error ", 0) == 0 ? text.substr(6) : text));
    }
    ShardFileEntry e;
    e.rank = r;
    std::istringstream in(text.substr(3));
    in >> e.first >> e.numel >> e.bytes >> e.crc32 >> e.file;
    HETSEQ_ASSERT(!in.fail(), "rank {}'s shard record '{}'", r, text);
    shards.push_back(e);
  }
  int64_t total = 0;
  for (const auto& e : shards) total += e.numel;
  for (const fs::path& file : files) {
    ShardManifest manifest{save_id_, file.filename().string(), num_updates, world_size_, total, shards};
    for (auto& e : manifest.shards) {
      const fs::path to = shard_file_path(file, save_id_, e.rank, world_size_);
      if (file != first_) copy_file_atomically(first_.parent_path() / e.file, to);
      e.file = to.filename().string();
    }
    write_manifest(manifest, manifest_path(file, save_id_));
  }
}

}  // namespace hetseq
