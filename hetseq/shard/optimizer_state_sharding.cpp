#include "hetseq/shard/optimizer_state_sharding.h"

#include "hetseq/core/error.h"

namespace hetseq {

OptimizerStateSharding::OptimizerStateSharding(std::unique_ptr<ShardedOptimizer> optimizer,
                                               std::shared_ptr<GradientReducer> reducer)
    : optimizer_(std::move(optimizer)), reducer_(std::move(reducer)) {
  HETSEQ_ASSERT(optimizer_ && reducer_, "OptimizerStateSharding built with a null part");
}

}  // namespace hetseq
