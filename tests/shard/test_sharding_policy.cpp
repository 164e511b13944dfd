// ShardingPolicy: what the session asks of a --zero-sharding choice, for one rank and for more, and the
// combinations it refuses, word for word.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/shard/sharding_policy.h"

using hetseq::ShardingPolicy;
using hetseq::ZeroSharding;

TEST_CASE("ShardingPolicy answers per --zero-sharding choice over more than one rank", "[zero_shard]") {
  struct Row {
    ZeroSharding mode;
    bool steps, sums, gathers;
  };
  const std::vector<Row> rows = {{ZeroSharding::kNone, false, false, false},
                                 {ZeroSharding::kOptimizerState, true, false, false},
                                 {ZeroSharding::kGradients, true, true, false},
                                 {ZeroSharding::kFull, true, true, true}};
  for (const Row& row : rows) {
    INFO(hetseq::to_string(row.mode));
    const ShardingPolicy policy(row.mode, /*distributed=*/true);
    CHECK(policy.mode() == row.mode);
    CHECK(policy.steps_shards() == row.steps);
    CHECK(policy.sums_gradients_to_owners() == row.sums);
    CHECK(policy.gathers_parameters() == row.gathers);
    CHECK(policy.counted_in_memory() == row.mode);
  }
}

TEST_CASE("ShardingPolicy with one rank shards nothing but keeps its choice", "[zero_shard]") {
  for (ZeroSharding mode : {ZeroSharding::kNone, ZeroSharding::kOptimizerState, ZeroSharding::kGradients,
                            ZeroSharding::kFull}) {
    INFO(hetseq::to_string(mode));
    const ShardingPolicy policy(mode, /*distributed=*/false);
    CHECK(policy.mode() == mode);
    CHECK_FALSE(policy.steps_shards());
    CHECK_FALSE(policy.sums_gradients_to_owners());
    CHECK_FALSE(policy.gathers_parameters());
    CHECK(policy.counted_in_memory() == ZeroSharding::kNone);
  }
}

TEST_CASE("ShardingPolicy::check_options refuses what summing buckets to owners cannot honour", "[zero_shard]") {
  hetseq::DdpOptions hook;
  hook.comm_hook = hetseq::CommHook::kFp16;
  hetseq::DdpOptions unused;
  unused.find_unused_parameters = true;
  hetseq::DdpOptions shm;
  shm.shared_memory = hetseq::SharedMemoryReduceMode::kOn;
  for (const hetseq::DdpOptions& ddp : {hook, unused, shm}) {
    CHECK_NOTHROW(ShardingPolicy::check_options(ZeroSharding::kNone, ddp));
    CHECK_NOTHROW(ShardingPolicy::check_options(ZeroSharding::kOptimizerState, ddp));
  }
  CHECK_NOTHROW(ShardingPolicy::check_options(ZeroSharding::kFull, hetseq::DdpOptions{}));
  CHECK_THROWS_MATCHES(ShardingPolicy::check_options(ZeroSharding::kGradients, hook), hetseq::UsageError,
                       Catch::Message("--zero-sharding os+grad: --ddp-comm-hook fp16 is not supported with it, use "
                                      "--ddp-comm-hook none; each bucket is summed to the rank that owns it"));
  CHECK_THROWS_MATCHES(ShardingPolicy::check_options(ZeroSharding::kFull, unused), hetseq::UsageError,
                       Catch::Message("--zero-sharding full: --find-unused-parameters is not supported with it; each "
                                      "bucket is summed to the rank that owns it"));
  CHECK_THROWS_MATCHES(ShardingPolicy::check_options(ZeroSharding::kGradients, shm), hetseq::UsageError,
                       Catch::Message("--zero-sharding os+grad: --shared-memory-reduce on is not supported with it; "
                                      "each bucket is summed to the rank that owns it"));
}

TEST_CASE("ShardingPolicy::check_parameters refuses a parameter without a gradient where buckets go to owners",
          "[zero_shard]") {
  const std::vector<torch::Tensor> params = {torch::zeros({2}, torch::requires_grad()), torch::zeros({3})};
  CHECK_NOTHROW(ShardingPolicy(ZeroSharding::kOptimizerState, true).check_parameters(params, "mnist"));
  CHECK_NOTHROW(ShardingPolicy(ZeroSharding::kFull, false).check_parameters(params, "mnist"));
  CHECK_THROWS_MATCHES(ShardingPolicy(ZeroSharding::kFull, true).check_parameters(params, "mnist"),
                       hetseq::UsageError,
                       Catch::Message("--zero-sharding full: task mnist's model has a parameter that takes no "
                                      "gradient; every parameter must take one under full (use os)"));
  CHECK_NOTHROW(ShardingPolicy(ZeroSharding::kGradients, true).check_parameters({params[0]}, "mnist"));
}
