#include "hetseq/shard/sharding_factory.h"

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/shard/gradient_sharding.h"
#include "hetseq/shard/no_sharding.h"
#include "hetseq/shard/optimizer_state_sharding.h"
#include "hetseq/shard/parameter_sharding.h"

namespace hetseq {

std::unique_ptr<ShardingStrategy> make_sharding_strategy(std::vector<torch::Tensor> params,
                                                         const optim::OptimizerFactory& make,
                                                         std::shared_ptr<GradientReducer> reducer,
                                                         c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                         const ShardingOptions& options) {
  if (options.mode == ZeroSharding::kNone || !group || group->getSize() == 1) {
    if (options.mode != ZeroSharding::kNone) {
      log::info("[zero] one rank: --zero-sharding {} has nothing to shard", to_string(options.mode));
    }
    HETSEQ_ASSERT(reducer, "make_sharding_strategy for one rank without a reducer");
    return std::make_unique<NoSharding>(make(std::move(params)), std::move(reducer));
  }
  ShardedOptimizerOptions sharded;
  sharded.budget_bytes = options.budget_bytes;
  const bool json = options.json;
  const int64_t rank = group->getRank();
  // The plan's lines, printed once after the first update, when the state exists.
  auto report = [json, rank](const std::vector<ShardReport>& ranks) {
    if (rank == 0) print_shard_reports(ranks, json);
  };
  if (shards_gradients(options.mode)) {
    const bool full = options.mode == ZeroSharding::kFull;
    sharded.gather_parameters = !full;
    auto optimizer = ShardedOptimizer::create(params, make, group, sharded, report);
    int64_t total_bytes = 0;
    for (const auto& p : params) total_bytes += static_cast<int64_t>(p.nbytes());
    const int64_t bucket = shard_bucket_bytes(total_bytes, group->getSize(), options.bucket_bytes);
    std::shared_ptr<UnitGather> units;
    if (full) {
      HETSEQ_ASSERT(options.unit_group, "--zero-sharding full without the units' process group");
      const std::vector<int64_t> unit_of =
          options.unit_of.empty() ? std::vector<int64_t>(params.size(), -1) : options.unit_of;
      units = std::make_shared<UnitGather>(params, unit_of, optimizer->plan(), options.unit_group);
    }
    auto shard_reducer =
        std::make_shared<ShardReducer>(std::move(params), options.buffers, optimizer->plan(), group, bucket);
    if (!full) {
      return std::make_unique<GradientSharding>(std::move(optimizer), std::move(shard_reducer), std::move(group));
    }
    if (options.set_unit_runner) options.set_unit_runner(units);
    return std::make_unique<ParameterSharding>(std::move(optimizer), std::move(shard_reducer), std::move(units),
                                               std::move(group), options.host_group);
  }
  HETSEQ_ASSERT(reducer, "make_sharding_strategy for --zero-sharding os without a reducer");
  return std::make_unique<OptimizerStateSharding>(
      ShardedOptimizer::create(std::move(params), make, std::move(group), sharded, report), std::move(reducer));
}

}  // namespace hetseq
