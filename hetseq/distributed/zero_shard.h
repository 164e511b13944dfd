#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "hetseq/distributed/zero_sharding.h"

namespace hetseq {

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
/// out empty (its budget is too small a share for one alignment of the parameters).
std::vector<ShardRange> plan_shards(const std::vector<int64_t>& budget_bytes, int64_t total_numel,
                                    int64_t alignment = 16);

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

/// How ShardGather moves the updated shards (see Note [Gathering uneven shards]).
enum class GatherMethod { kAllgatherPadded, kBroadcastPerRank };

/// Gathers each rank's updated shard of the parameters to every rank, over a c10d group (Gloo or
/// NCCL: the same collectives, on the parameters' device). Built once; gather() is a collective that
/// every rank calls after its optimizer has stepped its shard. The parameters must be contiguous and
/// share one dtype and device. See Note [Gathering uneven shards].
class ShardGather {
 public:
  ShardGather(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<ShardRange> plan,
              std::vector<torch::Tensor> params, GatherMethod method = GatherMethod::kBroadcastPerRank);

  /// Writes every other rank's shard into this rank's parameters.
  void gather();

  const std::vector<ShardRange>& plan() const { return plan_; }
  int64_t rank() const { return rank_; }

 private:
  void pack(int64_t rank, torch::Tensor& into) const;
  void unpack(int64_t rank, const torch::Tensor& from);

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<ShardRange> plan_;                   // [rank]
  std::vector<torch::Tensor> flat_;                // [param] 1-D views of the parameters
  std::vector<std::vector<ShardSlice>> slices_;    // [rank][slice]
  GatherMethod method_;
  int64_t rank_;
  std::vector<torch::Tensor> buffers_;             // [rank] of the largest shard's size (allgather), or one (broadcasts)
  torch::Tensor send_;                             // this rank's padded shard (allgather)
};

}  // namespace hetseq
