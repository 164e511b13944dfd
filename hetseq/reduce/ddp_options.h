#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "hetseq/core/option_names.h"
#include "hetseq/reduce/comm_hook.h"

namespace hetseq {

/// PowerSGD's settings (--ddp-comm-hook powersgd). See Note [PowerSGD].
struct PowerSgdOptions {
  int64_t rank = 1;                 // --powersgd-rank: the rank of the low-rank approximation (>= 1)
  int64_t start_update = 100;       // --powersgd-start-update: plain summed allreduce for updates before it
  double min_compression_rate = 2;  // compress a tensor only when (n + m) * rank * rate <= n * m
  uint64_t seed = 0;                // seed of the initial Q matrices (the same on every rank; --seed)

  /// Throws hetseq::UsageError naming the flag of an invalid value (a rank below 1, a negative start).
  void validate() const;
};

/// --shared-memory-reduce: whether ranks of one machine sum their CPU gradient buckets through shared memory
/// instead of the process group's transport. See Note [Shared-memory reduction].
enum class SharedMemoryReduceMode {
  kAuto,  // when every rank runs on this machine, with CPU parameters and comm hook none, and /dev/shm has room
  kOn,    // always; an error naming the flag when that cannot be
  kOff,   // never: the process group carries the buckets
};
/// Parses a --shared-memory-reduce value (auto, on, off); hetseq::UsageError naming the option in `naming`'s
/// words otherwise.
SharedMemoryReduceMode parse_shared_memory_reduce(const std::string& value, Naming naming = Naming::kFlags);
/// The --shared-memory-reduce spelling of `mode`.
std::string to_string(SharedMemoryReduceMode mode);

/// The reducer's options that its messages name, in both front ends (Note [Options in the user's words]).
inline constexpr OptionName kBucketCapMbOption{"--bucket-cap-mb", "bucket_cap_mb"};
inline constexpr OptionName kSharedMemoryOption{"--shared-memory-reduce", "shared_memory", /*text=*/true};
/// The wait of the shared-memory reduction: --distributed-timeout, or DistributedDataParallel's timeout_s.
inline constexpr OptionName kSharedMemoryTimeoutOption{"--distributed-timeout", "timeout_s"};

/// How the distributed reducer moves gradients: the home of its flags (declared and read in
/// hetseq/reduce/ddp_flags.h), checked once by validate().
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
  /// Whose words the reducer's messages use for these options: the flags', or the Python package's keywords
  /// (set by its binding). See Note [Options in the user's words].
  Naming naming = Naming::kFlags;

  /// Throws hetseq::UsageError naming the flag of an invalid value or combination: --bucket-cap-mb not a
  /// positive finite number (named in `naming`'s words), --shared-memory-reduce on with a comm hook, or
  /// PowerSGD's settings (checked whatever the hook, as a malformed flag is an error even when unused). Called
  /// once, where the options come in: by read_ddp_options for hetseq-train, by hetseq::train for a program of
  /// its own, by the Python package's binding for hetseq.DistributedDataParallel.
  void validate() const;
};

}  // namespace hetseq
