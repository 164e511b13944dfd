#pragma once

#include <cstdint>

#include "hetseq/cli/train_options.h"

namespace hetseq::cli {

/// This node's workers: --distributed-gpus, else the visible CUDA devices (none with --cpu), else 1.
int64_t local_workers(const TrainOptions& options);

/// Starts this node's `workers` worker processes and waits for them (HetSeq's spawn; see
/// hetseq/distributed/launcher.h). Without --distributed-world-size the world is this node's workers;
/// without --distributed-init-method on such a single-node world, the launcher hosts a store on a free
/// loopback port. Returns the exit code of the first worker that failed, else 0.
int spawn_workers(const TrainOptions& options, int argc, const char* const argv[], int64_t workers);

}  // namespace hetseq::cli
