#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "hetseq/reduce/comm_hook.h"

namespace hetseq {

/// PowerSGD's settings (--ddp-comm-hook powersgd). See Note [PowerSGD].
struct PowerSgdOptions {
  int64_t rank = 1;                 // --powersgd-rank: the rank of the low-rank approximation (>= 1)
  int64_t start_update = 0;         // --powersgd-start-update: plain summed allreduce for updates before it
  double min_compression_rate = 2;  // compress a tensor only when (n + m) * rank * rate <= n * m
  uint64_t seed = 0;                // seed of the initial Q matrices (the same on every rank; --seed)
};

/// --shared-memory-reduce: whether ranks of one machine sum their CPU gradient buckets through shared memory
/// instead of the process group's transport. See Note [Shared-memory reduction].
enum class SharedMemoryReduceMode {
  kAuto,  // when every rank runs on this machine, with CPU parameters and comm hook none, and /dev/shm has room
  kOn,    // always; an error naming the flag when that cannot be
  kOff,   // never: the process group carries the buckets
};
/// Parses a --shared-memory-reduce value (auto, on, off); hetseq::UsageError naming the flag otherwise.
SharedMemoryReduceMode parse_shared_memory_reduce(const std::string& value);

/// How the distributed reducer moves gradients: the home of its flags, which hetseq-train reads straight
/// into it (hetseq/cli/train_options.cpp) and check_ddp_options checks once.
struct DdpOptions {
  double bucket_cap_mb = 25;            // --bucket-cap-mb: largest gradient bucket, in MiB (fractions allowed)
  bool find_unused_parameters = false;  // --find-unused-parameters: let parameters go without gradient
  bool broadcast_buffers = true;        // --broadcast-buffers: rank 0's buffers before each update's forward
  CommHook comm_hook = CommHook::kNone;  // --ddp-comm-hook: how buckets travel; see Note [Comm hooks]
  PowerSgdOptions powersgd;              // --powersgd-rank, --powersgd-start-update (comm_hook kPowerSgd)
  SharedMemoryReduceMode shared_memory = SharedMemoryReduceMode::kAuto;  // --shared-memory-reduce
  /// How long a rank waits for its peers in a shared-memory reduction (the session sets --distributed-timeout).
  std::chrono::milliseconds shared_memory_timeout{std::chrono::minutes(5)};
  /// The first bucket layout, [bucket][parameter index] (a checkpoint's bucket_layout); empty: the
  /// parameters in reverse order, cut by size. See Note [Bucketed reduction].
  std::vector<std::vector<int64_t>> initial_buckets;
};

/// Throws hetseq::UsageError naming the flag when --bucket-cap-mb is not a positive finite number (PowerSgd
/// checks its own settings).
void check_ddp_options(const DdpOptions& options);

}  // namespace hetseq
