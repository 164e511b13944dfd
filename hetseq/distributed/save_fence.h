#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

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

  /// Every rank calls it at the same save point, with an `id` no earlier save point used (the update
  /// count). Rank 0 runs `write` while a thread beats a heartbeat into the store, then tells the
  /// others how it went; the other ranks do not run `write` and return when rank 0 is done. Throws
  /// on rank 0 whatever `write` throws; on the others hetseq::InputError with rank 0's message when its
  /// save failed, and hetseq::PeerError when rank 0's heartbeat stops for `liveness` or the save takes
  /// longer than `limit`.
  void run(int64_t id, const std::function<void()>& write);

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int64_t rank_;
  int64_t world_size_;
  std::chrono::milliseconds liveness_;
  std::chrono::milliseconds limit_;
};

}  // namespace hetseq
