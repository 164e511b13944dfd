#include "hetseq/session/session_options.h"

#include <algorithm>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

int64_t MixedPrecisionOptions::default_scale_window(int64_t micro_batches_per_update) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, micro_batches_per_update));
}

void OptimizationOptions::validate() const {
  if (clip_norm < 0) throw UsageError(fmt::format("--clip-norm: {} is negative; 0 turns clipping off", clip_norm));
  for (int64_t u : update_freq) {
    if (u <= 0) throw UsageError(fmt::format("--update-freq: {} must be a positive integer", u));
  }
  if (lr.empty()) throw UsageError("--lr (TrainOptions::optimization.lr) is empty; give at least one learning rate");
  for (double v : lr) {
    if (v < 0) throw UsageError(fmt::format("--lr: {} is negative", v));
  }
}

// --zero-sharding os+grad and full reduce plain sums of buckets to their owners (Note [Sharded gradients]): the
// comm hooks, the shared-memory path and unused parameters belong to the allreduce reducer.
void DistributedOptions::validate() const {
  if (!shards_gradients(zero_sharding)) return;
  const std::string mode = to_string(zero_sharding);
  auto refuse = [&mode](const std::string& what) {
    throw UsageError(fmt::format("--zero-sharding {}: {}; each bucket is summed to the rank that owns it", mode, what));
  };
  if (ddp.comm_hook != CommHook::kNone) {
    refuse(fmt::format("--ddp-comm-hook {} is not supported with it, use --ddp-comm-hook none",
                       to_string(ddp.comm_hook)));
  }
  if (ddp.find_unused_parameters) refuse("--find-unused-parameters is not supported with it");
  if (ddp.shared_memory == SharedMemoryReduceMode::kOn) refuse("--shared-memory-reduce on is not supported with it");
}

}  // namespace hetseq
