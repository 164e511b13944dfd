#pragma once
/// Gathers the ranks' updated shards of the parameters to every rank. See Note [Gathering uneven shards].

#include <cstdint>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "hetseq/shard/shard_plan.h"

namespace hetseq {

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
