#pragma once
/// How a worker joins its world (hetseq::World), apart from World, which names c10d types.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace hetseq {

/// How a worker joins its world: HetSeq's distributed flags, as one worker sees them.
struct WorldOptions {
  std::string init_method;            // --distributed-init-method (empty: Slurm's variables, or none)
  std::optional<int64_t> world_size;  // --distributed-world-size
  int64_t rank = 0;                   // --distributed-rank: this worker's global rank
  bool rank_given = false;            // whether --distributed-rank was on the command line
  int64_t device_id = 0;              // --device-id: this worker's device on its node
  bool cpu = false;                   // --cpu
  std::string backend;                // --distributed-backend (empty: nccl on CUDA, else gloo)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // --distributed-timeout: per collective
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};  // --rendezvous-timeout: start and end
  std::chrono::milliseconds checkpoint_timeout{std::chrono::hours(1)};    // --checkpoint-timeout (SaveFence)
  std::string secret_file;              // --distributed-secret-file (empty: HETSEQ_SECRET_FILE, or none)
  bool debug_collectives = false;     // --debug-collectives: every collective checked across ranks
};

}  // namespace hetseq
