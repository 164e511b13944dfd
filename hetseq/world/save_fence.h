#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace hetseq {

/// Holds the other ranks at a checkpoint while rank 0 writes it, so that a slow save (a large model,
/// a slow shared filesystem) never counts against --distributed-timeout: the others wait on the
/// store, not in a collective, for as long as rank 0 shows progress. See Note [Checkpoint fence].
class SaveFence {
 public:
  /// `liveness`: how long rank 0 may go without a heartbeat before the others give up on it
  /// (--distributed-timeout); `limit`: the longest a save may take in all (--checkpoint-timeout).
  SaveFence(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t world_size, std::chrono::milliseconds liveness,
            std::chrono::milliseconds limit);

  /// Every rank calls it at the same save point, with an `id` naming it in messages (the update count;
  /// two save points may share one, see prefix()). Rank 0 runs `write` while a thread beats a heartbeat into the store, then tells the
  /// others how it went; the other ranks do not run `write` and return when rank 0 is done. Throws
  /// on rank 0 whatever `write` throws; on the others rank 0's message, as hetseq::PeerError when rank 0
  /// lost a peer (a PeerError) and as hetseq::InputError otherwise, and hetseq::PeerError when rank 0's
  /// heartbeat stops for `liveness` or the save takes longer than `limit`.
  void run(int64_t id, const std::function<void()>& write);

  // A sharded save (Note [Sharded optimizer state in checkpoints]): every rank writes its own shard file
  // before run(), and rank 0 writes the rest inside run() once every shard is written.

  /// Every rank calls it at the save point `id`: returns rank 0's `value` (the others' is ignored), which
  /// the others wait for up to `liveness` (rank 0 arrives from the same collective as they do). Throws
  /// hetseq::PeerError when it does not come.
  std::string share(int64_t id, const std::string& value);
  /// Every rank but 0 calls it for its part of the save `id` (its optimizer shard): runs `write` while a
  /// thread beats a heartbeat of this rank into the store, then hands rank 0 the record that `write`
  /// returns, or "error <what>" when it throws (and rethrows). See Note [Lost writers].
  void write_part(int64_t id, const std::function<std::string()>& write);
  /// Rank 0, inside run()'s `write`: every other rank's record of write_part() for the save `id`, [rank]
  /// (rank 0's entry empty). Throws hetseq::PeerError naming the rank when a rank's heartbeat stops for
  /// `liveness` before its record comes (it died or hangs), or when the records take longer than `limit`.
  std::vector<std::string> collect(int64_t id);

 private:
  /// The store keys' prefix for the save point `id`: "save/<id>.<n>", n the number of run()s with this
  /// `id` before, so that two save points at one update count (an epoch's end after an interval save
  /// when fp16 skipped every update in between) never read each other's keys.
  std::string prefix(int64_t id) const;

  c10::intrusive_ptr<c10d::Store> store_;
  int64_t rank_;
  int64_t world_size_;
  std::chrono::milliseconds liveness_;
  std::chrono::milliseconds limit_;
  std::map<int64_t, int64_t> runs_;  // [id] run()s finished (or failed) with that id
};

}  // namespace hetseq
