#include "hetseq/session/distributed_flags.h"

#include "hetseq/core/error.h"
#include "hetseq/core/flag_text.h"
#include "hetseq/reduce/ddp_flags.h"
#include "hetseq/world/world_flags.h"

namespace hetseq {

void declare_distributed_flags(FlagSet& flags, const DistributedOptions& d) {
  declare_world_flags(flags, d.world);
  const std::string gpus_help = "workers on this node, worker i on device i (default: CUDA devices, or 1)";
  if (d.gpus) {
    flags.add("distributed-gpus", gpus_help, flag_text(*d.gpus)).per_rank();
  } else {
    flags.add_optional("distributed-gpus", gpus_help).per_rank();
  }
  flags.add_switch("distributed-no-spawn", "run one worker in this process instead of starting --distributed-gpus "
                   "workers", d.no_spawn).per_rank();
  declare_ddp_flags(flags, d.ddp);
  flags.add_switch("fast-stat-sync", "reduce logged statistics in one small allreduce", d.fast_stat_sync)
      .add("zero-sharding", "none: every rank keeps everything whole; os: each rank keeps the optimizer state of a "
           "contiguous shard of the parameters, sized by --memory-budget, and the updated shards are gathered (the "
           "same training as none); os+grad: each rank keeps its shard of the summed gradients too (the same "
           "training as none, within rounding); full: each rank keeps only its shard of the parameters too, and "
           "gathers each unit of the model (an encoder layer, say) around its forward and backward (as os+grad)",
           to_string(d.zero_sharding));
  const std::string budget_help =
      "GB (2^30 bytes) of memory this rank offers for training; under --zero-sharding os, os+grad and full shards "
      "are proportional to the ranks' budgets (default: the free memory: CUDA's free device memory, or "
      "MemAvailable and the cgroup limit). A rank whose parameters (shard), gradients (shard), optimizer state "
      "(shard) and measured activations do not fit stops before training, naming the bytes";
  if (d.memory_budget_bytes) {
    flags.add("memory-budget", budget_help,
              flag_text(static_cast<double>(*d.memory_budget_bytes) / static_cast<double>(int64_t{1} << 30)))
        .per_rank();
  } else {
    flags.add_optional("memory-budget", budget_help).per_rank();
  }
  flags.add_switch("log-all-ranks", "every rank logs, and the per-rank summary (batch size, compute, communication "
                   "wait, bus bandwidth, slowest rank) is printed every --log-interval, not only at the end of each "
                   "epoch", d.log_all_ranks).per_rank();
}

DistributedOptions read_distributed_options(const FlagValues& values) {
  DistributedOptions g;
  g.world = read_world_options(values);
  g.world.cpu = values.flag("cpu");
  if (values.has("distributed-gpus")) g.gpus = values.positive("distributed-gpus");
  g.no_spawn = values.flag("distributed-no-spawn");
  g.fast_stat_sync = values.flag("fast-stat-sync");
  g.zero_sharding = parse_zero_sharding(values.text("zero-sharding"));
  if (values.has("memory-budget")) {
    const double gb = values.number("memory-budget");
    if (!(gb > 0) || gb > 1e9) {
      throw UsageError(fmt::format("--memory-budget: {} must be a positive number of GB (2^30 bytes)", gb));
    }
    g.memory_budget_bytes = static_cast<int64_t>(gb * static_cast<double>(int64_t{1} << 30));
  }
  g.ddp = read_ddp_options(values);
  g.log_all_ranks = values.flag("log-all-ranks");
  g.validate();
  return g;
}

}  // namespace hetseq
