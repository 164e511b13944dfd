#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hetseq/shard/shard_gather.h"
#include "hetseq/shard/zero_sharding.h"

namespace hetseq {

/// One rank's memory for the check: what it offers and what its micro-batch takes.
struct RankMemoryBudget {
  int64_t budget_bytes = 0;       // --memory-budget, or the free memory; 0: this rank is not checked
  bool from_free_memory = false;  // the budget is the free memory, read after the parameters were allocated
  int64_t activation_bytes = 0;   // measured: one forward and backward of its micro-batch
  int64_t micro_batch = 0;        // the micro-batch measured (for the message)
  /// It may run more than one micro-batch an update (--update-freq above 1, or a --balance-cap): the earlier
  /// micro-batches' gradients accumulate whole, also under os+grad and full.
  bool accumulates = false;
};

/// What the check knows of a run: the model, the optimizer and the ranks.
struct MemoryFitOptions {
  ZeroSharding sharding = ZeroSharding::kNone;
  int64_t num_params = 0;       // elements of all parameters
  int64_t element_bytes = 4;    // of a parameter, a gradient and an optimizer buffer (float32)
  int64_t state_buffers = 0;    // the optimizer's parameter-sized buffers (Optimizer::state_buffers)
  std::string optimizer;        // its name, for the message
  int64_t alignment = 16;       // of the shard plan (ShardedOptimizerOptions::alignment)
  GatherMethod gather = GatherMethod::kBroadcastPerRank;
  int64_t bucket_bytes = 25 << 20;  // --bucket-cap-mb in bytes (os+grad's buckets in flight)
  int64_t root_numel = 0;           // full: elements of the parameters in no unit (whole on every rank)
  int64_t largest_unit_numel = 0;   // full: elements of the largest unit (two are gathered at once)
  bool rank0_copies_model = false;  // full, saving on a CPU: rank 0 gathers the whole model for its file
  std::vector<RankMemoryBudget> ranks;  // [rank]
};

/// The bytes one rank needs to train, by what holds them. See Note [Memory that a rank needs].
struct MemoryNeed {
  int64_t parameters = 0;       // the whole model (0 when the budget is the free memory read after it was built);
                                // under full the rank's shard, the root and two gathered units
  int64_t gradients = 0;        // the whole model's gradients (the reducer's buckets), or os+grad's shard
  int64_t optimizer_state = 0;  // the optimizer's buffers for the rank's shard (the whole model without sharding)
  int64_t gather_buffers = 0;   // --zero-sharding os: where the ranks' updated shards are received
  int64_t checkpoint_copy = 0;  // full, rank 0 on a CPU with saving on: the whole model, gathered for its file
  int64_t activations = 0;      // measured
  int64_t total() const {
    return parameters + gradients + optimizer_state + gather_buffers + activations + checkpoint_copy;
  }
};

/// Every rank's need ([rank]), with the shard plan that ShardedOptimizer computes from the same budgets
/// under --zero-sharding os, os+grad and full (every rank's budget must then be positive). Pure.
std::vector<MemoryNeed> memory_needs(const MemoryFitOptions& options);

/// Checks that every rank with a budget has at least its need; throws hetseq::InputError with one line
/// naming the first rank that does not fit, the bytes it needs (and of what) and the bytes it has, and how
/// many other ranks do not fit either. Every rank runs it on the same figures, so all stop alike.
void check_memory_fits(const MemoryFitOptions& options);

}  // namespace hetseq
