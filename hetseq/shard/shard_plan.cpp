#include "hetseq/shard/shard_plan.h"

#include <algorithm>
#include <numeric>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

std::vector<ShardRange> plan_shards(const std::vector<int64_t>& budget_bytes, int64_t total_numel,
                                    int64_t alignment, Naming naming) {
  HETSEQ_ASSERT(!budget_bytes.empty() && total_numel > 0 && alignment > 0,
                "plan_shards: {} ranks, {} elements, alignment {}", budget_bytes.size(), total_numel, alignment);
  __int128 total_budget = 0;
  for (size_t r = 0; r < budget_bytes.size(); ++r) {
    if (budget_bytes[r] <= 0) {
      throw InputError(fmt::format("{}: rank {} has a budget of {} bytes; every rank needs a positive budget to hold "
                                   "its shard of the optimizer state",
                                   kMemoryBudgetOption.name(naming), r, budget_bytes[r]));
    }
    total_budget += budget_bytes[r];
  }
  // Boundaries in units of `alignment`, rounded to nearest from the exact cumulative share (integer
  // arithmetic, so every rank computes the same plan). Monotone, since the cumulative budgets are.
  const __int128 units = (total_numel + alignment - 1) / alignment;
  std::vector<ShardRange> plan(budget_bytes.size());
  __int128 before = 0;  // budgets of ranks before r
  int64_t first = 0;
  for (size_t r = 0; r < budget_bytes.size(); ++r) {
    before += budget_bytes[r];
    int64_t end = total_numel;
    if (r + 1 < budget_bytes.size()) {
      const __int128 end_units = (2 * units * before + total_budget) / (2 * total_budget);
      end = std::min<int64_t>(static_cast<int64_t>(end_units) * alignment, total_numel);
    }
    plan[r] = ShardRange{first, end - first};
    first = end;
  }
  for (size_t r = 0; r < plan.size(); ++r) {
    if (plan[r].numel == 0) {
      throw InputError(fmt::format("{}: rank {}'s budget ({} bytes of {} in all) is too small a share for one "
                                   "{}-element piece of the {} parameters; raise it, or use {}",
                                   kMemoryBudgetOption.name(naming), r, budget_bytes[r],
                                   static_cast<int64_t>(total_budget), alignment, total_numel,
                                   naming == Naming::kPython ? "the unsharded optimizer" : "--zero-sharding none"));
    }
  }
  return plan;
}

std::vector<ShardSlice> shard_slices(const std::vector<int64_t>& param_numels, ShardRange range) {
  std::vector<ShardSlice> out;
  const int64_t end = range.first + range.numel;
  int64_t start = 0;  // of parameter i in the flat space
  for (size_t i = 0; i < param_numels.size(); ++i) {
    const int64_t lo = std::max(start, range.first);
    const int64_t hi = std::min(start + param_numels[i], end);
    if (lo < hi) out.push_back(ShardSlice{i, lo - start, hi - lo});
    start += param_numels[i];
  }
  return out;
}

std::vector<torch::Tensor> slice_views(const std::vector<torch::Tensor>& params,
                                       const std::vector<ShardSlice>& slices) {
  std::vector<torch::Tensor> out;
  out.reserve(slices.size());
  for (const ShardSlice& s : slices) {
    const torch::Tensor& p = params.at(s.param);
    HETSEQ_ASSERT(p.is_contiguous(), "sharded parameter {} (sizes {}) is not contiguous", s.param,
                  fmt::join(p.sizes(), ","));
    out.push_back(p.detach().view({-1}).narrow(0, s.offset, s.numel));
  }
  return out;
}

}  // namespace hetseq
