#pragma once
// --distributed-init-method parsed, and this worker's rank and world size taken from the flags and the
// launcher's environment (torchrun's env://, Slurm's variables).

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace hetseq {

/// A parsed init method (see RendezvousOptions::init_method).
struct InitMethod {
  enum class Kind { kTcp, kFile, kEnv, kSlurm } kind;
  std::string host;  // tcp
  uint16_t port = 0;  // tcp; 0 lets the host pick one (read back with TCPStore::getPort)
  std::string path;  // file
};

/// Parses --distributed-init-method (with the environment for env:// and Slurm). Throws
/// hetseq::UsageError naming the flag or the variable that is missing or malformed.
InitMethod parse_init_method(const std::string& text, const std::map<std::string, std::string>& environment);

/// Whether torchrun (its elastic agent) started this process: TORCHELASTIC_RUN_ID is set. Then an
/// empty --distributed-init-method means env://, and the process is one worker (no spawning).
bool launched_by_torchrun(const std::map<std::string, std::string>& environment);

/// The process environment as a map (for parse_init_method and resolve_ranks).
std::map<std::string, std::string> process_environment();

/// Fills in `world_size` (--distributed-world-size), `rank` (--distributed-rank) and `local_rank` from
/// the init method's environment (env://, Slurm) where the flags leave them open; throws
/// hetseq::UsageError on a conflict or a rank outside the world. World calls it before rendezvous().
void resolve_ranks(const InitMethod& method, const std::map<std::string, std::string>& environment,
                   std::optional<int64_t>& world_size, std::optional<int64_t>& rank,
                   std::optional<int64_t>& local_rank);

}  // namespace hetseq
