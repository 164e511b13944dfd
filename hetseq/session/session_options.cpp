#include "hetseq/session/session_options.h"

#include <algorithm>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/shard/sharding_policy.h"

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

void DistributedOptions::validate() const { ShardingPolicy::check_options(zero_sharding, ddp); }

}  // namespace hetseq
