#pragma once

#include <cstdint>
#include <map>
#include <string>

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

/// Decides how this process starts from the flags, the environment (Slurm's variables) and the CUDA
/// devices it sees (`visible_devices`, ignored with --cpu). Touches no process and no device. Throws
/// hetseq::UsageError naming the flag or the Slurm variable that is inconsistent.
SpawnPlan plan_spawn(const TrainOptions& options, const std::map<std::string, std::string>& environment,
                     int64_t visible_devices);

/// This node's workers as plan_spawn decides for this process (its environment and CUDA devices):
/// --distributed-gpus, else the visible CUDA devices (none with --cpu), else 1; under Slurm 1 when a
/// node runs several tasks. Called by hetseq-train before anything else happens.
int64_t local_workers(const TrainOptions& options);

/// Starts this node's `workers` worker processes (local_workers) and waits for them (HetSeq's spawn; see
/// hetseq/distributed/launcher.h). Without --distributed-world-size the world is this node's workers,
/// or under Slurm with one task per node SLURM_NTASKS x workers; without --distributed-init-method on
/// a single-node world, the launcher hosts a store on a free loopback port. Returns the exit code of
/// the first worker that failed, else 0.
int spawn_workers(const TrainOptions& options, int argc, const char* const argv[], int64_t workers);

}  // namespace hetseq::cli
