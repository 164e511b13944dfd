#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace hetseq {

/// How the ranks find each other: HetSeq's --distributed-init-method and friends.
struct RendezvousOptions {
  /// `tcp://HOST:PORT` (a TCP store; rank 0 or its node's launcher hosts it), `file:///shared/path`
  /// (a store in a file on a shared filesystem), `env://` (MASTER_ADDR, MASTER_PORT, RANK,
  /// WORLD_SIZE, LOCAL_RANK as torchrun sets them), or empty: Slurm's variables when set.
  std::string init_method;
  std::optional<int64_t> world_size;  // --distributed-world-size
  std::optional<int64_t> rank;        // global rank of this worker
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // --distributed-timeout
  /// The TCP store is already hosted (by this node's launcher); rank 0 connects as a client.
  bool store_hosted_elsewhere = false;
};

/// Where this worker stands after the rendezvous.
struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;
  int64_t rank = 0;
  int64_t world_size = 1;
  std::optional<int64_t> local_rank;  // from env:// or Slurm, when they say
  std::string file_path;              // the store's file with file://, removed by rank 0 on leaving
  std::string prefix;                 // of every key, without the "/" that PrefixStore adds; Note [Rendezvous keys]
  std::string base_prefix;            // store_prefix(): the run and attempt, without the generation
  c10::intrusive_ptr<c10d::Store> raw_store;  // the store without the prefix
};

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

/// Fills in rank, world size and local rank from the init method's environment (env://, Slurm) where
/// the flags leave them open; throws hetseq::UsageError on a conflict or a rank outside the world.
void resolve_ranks(const InitMethod& method, const std::map<std::string, std::string>& environment,
                   RendezvousOptions& options, std::optional<int64_t>& local_rank);

/// Joins the rendezvous: opens the store (prefixed with store_prefix), claims this rank, then waits
/// until every rank has checked in. Throws hetseq::PeerError naming the ranks that never arrived
/// within the timeout, and hetseq::InputError when two workers claim the same rank (naming both hosts
/// and pids) or a file:// store holds an earlier run's keys.
Rendezvous rendezvous(const RendezvousOptions& options);

/// The last step of a run: waits until every rank is done; rank 0, which may host the store, leaves
/// only after the others have stopped using it, and with file:// then removes the store's file (a
/// rerun of the same command finds none). Throws hetseq::InputError naming missing ranks.
void leave_rendezvous(const Rendezvous& joined, std::chrono::milliseconds timeout);

/// A barrier on the store: every rank of `world_size` calls it with the same `name`; returns when all
/// have arrived. Throws hetseq::PeerError naming the ranks missing after `timeout` (with
/// `what_to_check` appended), and hetseq::InputError with the message a rank left in `<name>/open`
/// (a duplicate rank). See Note [Rendezvous keys].
void store_barrier(c10d::Store& store, const std::string& name, int64_t rank, int64_t world_size,
                   std::chrono::milliseconds timeout, const std::string& what_to_check);

/// The prefix of every key of this run and attempt, from the environment (torchrun's run id and
/// restart count, Slurm's job, step and requeue count); see Note [Rendezvous keys].
std::string store_prefix(const std::map<std::string, std::string>& environment);

}  // namespace hetseq
