#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hetseq/cli/train_options.h"

namespace hetseq::cli {

/// How hetseq-train starts on this node: as the only worker, or as the launcher of its local
/// workers. See Note [Spawning under Slurm] in spawn.cpp.
struct SpawnPlan {
  int64_t workers = 1;      // local workers; 1: this process is the worker and spawns nothing
  int64_t first_rank = 0;   // global rank of local worker 0 (when workers > 1)
  int64_t world_size = 1;   // ranks over all nodes (when workers > 1)
  std::string init_method;  // the workers' --distributed-init-method (when workers > 1)
  bool host_store = false;  // with tcp://, this node's launcher hosts the store (it holds rank 0)
};

/// Decides how this process starts from the flags, the environment (Slurm's variables; under torchrun,
/// which starts every worker itself, one worker) and the CUDA devices it sees (`visible_devices`, ignored with --cpu). Touches no process and no device. Throws
/// hetseq::UsageError naming the flag or the Slurm variable that is inconsistent.
SpawnPlan plan_spawn(const TrainOptions& options, const std::map<std::string, std::string>& environment,
                     int64_t visible_devices);

/// plan_spawn for this process: its environment and the CUDA devices it sees. Called by hetseq-train
/// before anything else happens.
SpawnPlan plan_for_this_process(const TrainOptions& options);

/// What a local worker's command line is made from.
struct WorkerLaunchOptions {
  std::vector<std::string> argv;     // the launcher's command line, argv[0] included, aliases resolved
  int64_t first_rank = 0;            // global rank of local worker 0
  int64_t world_size = 1;            // ranks over all nodes
  std::vector<int64_t> batch_sizes;  // [worker] --max-sentences of each local worker
  std::vector<int64_t> balance_caps; // [worker] --balance-cap of each local worker (empty: none given)
  int64_t intra_op_threads = 0;      // per worker; 0 leaves LibTorch's default
};

/// The command line of local worker `i`: `flags.argv` without the flags the launcher sets
/// (launcher_set_flags), plus --distributed-no-spawn, the world size, its rank, device, batch size
/// (and --balance-cap) and `init_method`.
std::vector<std::string> worker_command_line(const WorkerLaunchOptions& flags, int64_t i, const std::string& init_method);

/// Starts the `plan.workers` local worker processes of `plan` and waits for them (HetSeq's spawn; see
/// hetseq/world/launcher.h). Returns the exit code of the first worker that failed, else 0.
int spawn_workers(const TrainOptions& options, int argc, const char* const argv[], const SpawnPlan& plan);

}  // namespace hetseq::cli
