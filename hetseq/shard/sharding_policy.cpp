#include "hetseq/shard/sharding_policy.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

// --zero-sharding os+grad and full reduce plain sums of buckets to their owners (Note [Sharded gradients]): the
// comm hooks, the shared-memory path and unused parameters belong to the allreduce reducer.
void ShardingPolicy::check_options(ZeroSharding mode, const DdpOptions& ddp) {
  if (!shards_gradients(mode)) return;
  const std::string name = to_string(mode);
  auto refuse = [&name](const std::string& what) {
    throw UsageError(fmt::format("--zero-sharding {}: {}; each bucket is summed to the rank that owns it", name, what));
  };
  if (ddp.comm_hook != CommHook::kNone) {
    refuse(fmt::format("--ddp-comm-hook {} is not supported with it, use --ddp-comm-hook none",
                       to_string(ddp.comm_hook)));
  }
  if (ddp.find_unused_parameters) refuse("--find-unused-parameters is not supported with it");
  if (ddp.shared_memory == SharedMemoryReduceMode::kOn) refuse("--shared-memory-reduce on is not supported with it");
}

// --zero-sharding os+grad and full hook every parameter's gradient accumulator (Note [Sharded gradients]); the
// flags they cannot honour were refused where they came in (check_options).
void ShardingPolicy::check_parameters(const std::vector<at::Tensor>& params, const std::string& task) const {
  if (!sums_gradients_to_owners()) return;
  const std::string name = to_string(mode_);
  for (const auto& p : params) {
    if (!p.requires_grad()) {
      throw UsageError(fmt::format("--zero-sharding {}: task {}'s model has a parameter that takes no gradient; "
                                   "every parameter must take one under {} (use os)",
                                   name, task, name));
    }
  }
}

}  // namespace hetseq
