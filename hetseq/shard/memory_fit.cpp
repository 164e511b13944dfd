#include "hetseq/shard/memory_fit.h"

#include <algorithm>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/shard/shard_reducer.h"

namespace hetseq {

// Note [Memory that a rank needs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Before training, a rank that states a budget (--memory-budget, or under --zero-sharding os the free
// memory that is its default) is checked against what it will hold at the peak of an update:
//
//   parameters       T x e    the whole model, on every rank (only the optimizer state is sharded); under
//                             full (n + R + 2 U) x e: its shard, the R elements in no unit (the root, whole on
//                             every rank) and two gathered units of the largest, U (Note [Sharded parameters])
//   gradients        T x e    the whole model's gradients: the reducer's buckets, which .grad views;
//                             under os+grad n x e for its shard and at most 2 W + 1 buckets (shard_bucket_bytes)
//                             being copied or in flight, W copies each on its owner (Note [Sharded gradients]),
//                             never more than T x e; T x e again for a rank that runs more than one micro-batch
//                             an update (--update-freq, a --balance-cap), whose earlier micro-batches accumulate
//                             whole gradients in .grad
//   optimizer state  n x k x e  k parameter-sized buffers (Optimizer::state_buffers: Adam 2, Adadelta 2,
//                             SGD 1 with momentum, 0 without) for the n elements of the rank's shard (n = T
//                             without sharding); there are no fp32 master weights, since the parameters stay
//                             float32 under --fp16/--bf16 (Note [Sharded optimizer state])
//   gather buffers   L x e    --zero-sharding os with per-rank broadcasts: one buffer of the largest shard's
//                             size L, through which every rank's shard passes in turn ((W + 1) x L with the
//                             padded allgather); Note [Gathering uneven shards]; none under full (the units
//                             are gathered into their own buffers, counted above)
//   checkpoint copy  T x e    full, rank 0 on a CPU with saving on: the whole model, gathered unit by unit
//                             into its memory for checkpoint_last.pt (on a GPU the copy is in host memory)
//   activations      measured: the peak of the bytes allocated through LibTorch's allocators during one
//                             forward and backward of the rank's micro-batch (its --max-sentences, or its
//                             --balance-cap when smaller) of the first samples of the training split, with
//                             the gradients already allocated (peak_allocated_bytes), so it holds the
//                             autograd graph's saved tensors, the temporaries and the gradients of one pass
//                             before they are added into .grad
//
// with T the parameters' elements and e their element size. The plan is the shard plan that
// ShardedOptimizer computes from the same budgets (plan_shards), so the rank with the smallest budget
// has the smallest shard: under os a budget shrinks only the optimizer state, never the rest.
//
// Not counted: LibTorch's and the program's own memory (code, the thread pools, the allocator's
// caches and fragmentation), the training data in memory, the data loader's prefetched batches, the
// reducer's communication buffers beyond the buckets (Gloo's), a checkpoint being written (its
// serialised bytes), the validation passes, and micro-batches larger than the one measured (longer
// sequences than the first samples', or a share that --auto-balance grows without a cap), and under full the
// start: every rank builds (and resumes) the model whole before it is cut into shards, and measures its
// activations with the whole gradients, so a rank's memory at start is about the whole parameters, gradients and
// one pass's activations (LibTorch builds modules on a device, not as shapes alone). So a budget that passes is
// necessary, not sufficient: leave room beside it. When the budget is the free memory (the default under os), it is read after the model
// was built, so the parameters are already taken from it and not counted again.

std::vector<MemoryNeed> memory_needs(const MemoryFitOptions& options) {
  const int64_t world = static_cast<int64_t>(options.ranks.size());
  HETSEQ_ASSERT(world > 0 && options.num_params > 0, "memory_needs: {} ranks, {} parameters", world,
                options.num_params);
  const int64_t e = options.element_bytes;
  const int64_t whole = options.num_params * e;
  const bool sharded = shards_state(options.sharding) && world > 1;
  const bool sharded_grads = shards_gradients(options.sharding) && world > 1;
  const bool full = options.sharding == ZeroSharding::kFull && world > 1;
  std::vector<ShardRange> plan;  // [rank]
  if (sharded) {
    std::vector<int64_t> budgets;
    for (const RankMemoryBudget& r : options.ranks) budgets.push_back(r.budget_bytes);
    plan = plan_shards(budgets, options.num_params, options.alignment);
  }
  int64_t gather = 0;
  if (sharded && !full) {
    int64_t largest = 0;
    for (const ShardRange& s : plan) largest = std::max(largest, s.numel);
    gather = options.gather == GatherMethod::kBroadcastPerRank ? largest : (world + 1) * largest;
  }
  std::vector<MemoryNeed> needs;
  for (int64_t r = 0; r < world; ++r) {
    const RankMemoryBudget& b = options.ranks[static_cast<size_t>(r)];
    MemoryNeed n;
    const int64_t shard = sharded ? plan[static_cast<size_t>(r)].numel : options.num_params;
    // full: its shard, the root's parameters, and two units gathered at once (Note [Sharded parameters]).
    const int64_t held = full ? std::min(whole, (shard + options.root_numel + 2 * options.largest_unit_numel) * e) : whole;
    n.parameters = b.from_free_memory ? 0 : held;
    if (full && r == 0 && options.rank0_copies_model) n.checkpoint_copy = whole;
    // os+grad: its shard, a bucket being copied and two in flight, with W copies each on their owner (Note
    // [Sharded gradients]); never more than the whole model's.
    const int64_t bucket = shard_bucket_bytes(whole, world, options.bucket_bytes);
    n.gradients = sharded_grads && !b.accumulates ? std::min(whole, shard * e + (2 * world + 1) * bucket) : whole;
    n.optimizer_state = shard * options.state_buffers * e;
    n.gather_buffers = gather * e;
    n.activations = b.activation_bytes;
    needs.push_back(n);
  }
  return needs;
}

void check_memory_fits(const MemoryFitOptions& options) {
  const std::vector<MemoryNeed> needs = memory_needs(options);
  std::vector<size_t> short_ranks;  // ranks that do not fit
  for (size_t r = 0; r < needs.size(); ++r) {
    const int64_t budget = options.ranks[r].budget_bytes;
    if (budget > 0 && needs[r].total() > budget) short_ranks.push_back(r);
  }
  if (short_ranks.empty()) return;
  const size_t r = short_ranks.front();
  const MemoryNeed& n = needs[r];
  const RankMemoryBudget& b = options.ranks[r];
  const bool sharded = shards_state(options.sharding) && needs.size() > 1;
  const std::string source =
      b.from_free_memory ? "the free memory, read after the model was built"
                         : fmt::format("its --memory-budget of {:.6g} GB", static_cast<double>(b.budget_bytes) / (1 << 30));
  const std::string others =
      short_ranks.size() > 1 ? fmt::format(" ({} other rank(s) do not fit either)", short_ranks.size() - 1) : "";
  const std::string remedy =
      sharded ? fmt::format("give it a larger --memory-budget (its shard of the {} grows with it, the rest does "
                            "not) or a smaller --max-sentences",
                            options.sharding == ZeroSharding::kFull        ? "parameters, gradients and optimizer state"
                            : options.sharding == ZeroSharding::kGradients ? "gradients and the optimizer state"
                                                                           : "optimizer state")
              : "give it a larger --memory-budget or a smaller --max-sentences, or shard the optimizer state with "
                "--zero-sharding os";
  throw InputError(fmt::format(
      "--memory-budget: rank {} needs {} bytes but has {} bytes available ({}){}: parameters {}{}, gradients {}, "
      "{} optimizer state {} ({} buffer(s) per element{}), {}activations {} (one forward and backward of {} "
      "samples){}; {}",
      r, n.total(), b.budget_bytes, source, others, n.parameters, b.from_free_memory ? " (already allocated)" : "",
      n.gradients, options.optimizer, n.optimizer_state, options.state_buffers, sharded ? ", its shard" : "",
      sharded ? fmt::format("shard gather buffers {}, ", n.gather_buffers) : "", n.activations, b.micro_batch,
      n.checkpoint_copy > 0 ? fmt::format(", the whole model gathered for a checkpoint {} (--no-save avoids it)",
                                          n.checkpoint_copy)
                            : "",
      remedy));
}

}  // namespace hetseq
