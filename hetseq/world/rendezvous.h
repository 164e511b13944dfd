#pragma once
// How the ranks of a run meet: the store, every rank checked in, and the last barrier on leaving.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "hetseq/world/job_secret.h"

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
  /// How often a rank waiting for the others says whom it waits for (0: never); Note [Saying whom a
  /// barrier waits for] in rendezvous_keys.cpp.
  std::chrono::milliseconds report_interval{std::chrono::seconds(15)};
  /// --distributed-secret-file: every value of the store sealed with the job's key (Note [Sealed store]); none:
  /// c10d's store as it is.
  std::shared_ptr<const JobSecret> secret;
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
  std::string address;                // where the ranks meet: tcp://HOST:PORT (the port read back) or file:///path
  std::chrono::milliseconds report_interval{0};  // RendezvousOptions::report_interval, for the final barrier
};

/// Joins the rendezvous: opens the store (prefixed with store_prefix), claims this rank, then waits
/// until every rank has checked in. Throws hetseq::PeerError naming the ranks that never arrived
/// within the timeout, and hetseq::InputError when two workers claim the same rank (naming both hosts
/// and pids) or a file:// store holds an earlier run's keys.
Rendezvous rendezvous(const RendezvousOptions& options);

/// The last step of a run: waits until every rank is done; rank 0, which may host the store, leaves
/// only after the others have stopped using it, and with file:// then removes the store's file (a
/// rerun of the same command finds none). Throws hetseq::InputError naming missing ranks.
void leave_rendezvous(const Rendezvous& joined, std::chrono::milliseconds timeout);

}  // namespace hetseq
