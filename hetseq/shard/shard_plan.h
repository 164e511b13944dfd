#pragma once
/// The shard plan: how the flat space of the parameters' elements is cut over the ranks, and the
/// parts of the parameters that fall in one shard. See Note [Sharded optimizer state].

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "hetseq/core/option_names.h"

namespace hetseq {

/// A rank's memory budget as the shard plan's messages name it (Note [Options in the user's words]):
/// hetseq-train's flag, or hetseq.ShardedOptimizer's argument.
inline constexpr OptionName kMemoryBudgetOption{"--memory-budget", "memory_budget"};

/// One rank's shard: the elements [first, first + numel) of the flat element space that lays the
/// parameters end to end in their order (a tensor may straddle two shards).
struct ShardRange {
  int64_t first = 0;
  int64_t numel = 0;
  bool operator==(const ShardRange& o) const { return first == o.first && numel == o.numel; }
};

/// The shards of `total_numel` elements over the ranks, sized in proportion to `budget_bytes` ([rank],
/// each > 0): rank r's shard starts at round(U * B_<r / B) * alignment, where U = ceil(total / alignment)
/// and B_<r is the budgets of the ranks before r, so every boundary but the end is a multiple of
/// `alignment`, each shard is within one alignment of its share, and the shards cover [0, total) exactly.
/// Pure. Throws hetseq::InputError naming the rank for a budget <= 0, and for a rank whose shard comes
/// out empty (its budget is too small a share for one alignment of the parameters), in `naming`'s words.
std::vector<ShardRange> plan_shards(const std::vector<int64_t>& budget_bytes, int64_t total_numel,
                                    int64_t alignment = 16, Naming naming = Naming::kFlags);

/// The part of one parameter that lies in a shard: elements [offset, offset + numel) of parameter
/// `param` (flattened).
struct ShardSlice {
  size_t param = 0;
  int64_t offset = 0;
  int64_t numel = 0;
};

/// The slices of parameters of `param_numels` ([param], in order) that fall in `range`, in order.
std::vector<ShardSlice> shard_slices(const std::vector<int64_t>& param_numels, ShardRange range);

/// The 1-D views of `params` ([param], contiguous) for `slices`: they share the parameters' storage.
std::vector<torch::Tensor> slice_views(const std::vector<torch::Tensor>& params,
                                       const std::vector<ShardSlice>& slices);

}  // namespace hetseq
