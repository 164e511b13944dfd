#include "hetseq/shard/gradient_sharding.h"

#include "hetseq/core/error.h"
#include "hetseq/world/lost_peer.h"

namespace hetseq {

GradientSharding::GradientSharding(std::unique_ptr<ShardedOptimizer> optimizer, std::shared_ptr<ShardReducer> reducer,
                                   c10::intrusive_ptr<c10d::ProcessGroup> group)
    : optimizer_(std::move(optimizer)), reducer_(std::move(reducer)), group_(std::move(group)) {
  HETSEQ_ASSERT(optimizer_ && reducer_ && group_, "GradientSharding built with a null part");
  gradients_ = reducer_->shard_gradient_views(optimizer_->slices());
  optimizer_->use_gradients(gradients_);
}

torch::Tensor global_norm_of_shards(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const torch::Tensor& local) {
  std::vector<torch::Tensor> squares{local.square().reshape({1})};
  wait_for_peers(group->allreduce(squares), group->getRank(), group->getSize(),
                 "allreduce of the gradient shards' squared norms");
  return squares[0].sqrt().reshape({});
}

}  // namespace hetseq
