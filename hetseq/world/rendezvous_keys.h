#pragma once
// The run's keys in the rendezvous store: the prefix of a run and attempt, a worker's claim of its
// rank, and the barrier that counts the ranks in. See Note [Rendezvous keys].

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace hetseq {

/// The prefix of every key of this run and attempt, from the environment (torchrun's run id and
/// restart count, Slurm's job, step and requeue count); see Note [Rendezvous keys].
std::string store_prefix(const std::map<std::string, std::string>& environment);

/// Who claimed a rank, and for which world size: "host pid W" under "rank/<r>/by/<n>" (Note
/// [Rendezvous keys]).
struct RankClaim {
  std::string host;
  long pid = 0;
  int64_t world_size = 0;  // the claimer's --distributed-world-size

  /// This process (its host name and pid), for a world of `world_size`.
  static RankClaim of_this_process(int64_t world_size);
};

/// Claims `rank` for `claim`: add("rank/<rank>", 1), then `claim` under "rank/<rank>/by/<n>". Returns
/// n: 1 for the first worker to claim the rank, more for each later one (a duplicate rank).
/// rendezvous() calls it.
int64_t claim_rank(c10d::Store& store, int64_t rank, const RankClaim& claim);

/// The first claim of `rank`, when there is one that reads as a claim.
std::optional<RankClaim> read_rank_claim(c10d::Store& store, int64_t rank);

/// What a rank waiting at store_barrier says while it waits (Note [Saying whom a barrier waits for]): every
/// `interval`, one line "[rendezvous] waiting for ranks 1..1 of 2 at tcp://10.0.0.1:23456 (joined: 0)".
struct BarrierReport {
  std::chrono::milliseconds interval{0};  // 0: say nothing
  std::string address;                    // where the ranks meet (tcp://HOST:PORT, file:///path), for the line
};

/// `ranks` (ascending) as runs "a..b" joined by ", " ("1..1, 3..5"), or as "a" for a run of one when
/// `bare_singles`; "none" when empty.
std::string rank_runs(const std::vector<int64_t>& ranks, bool bare_singles);

/// A barrier on the store: every rank of `world_size` calls it with the same `name`; returns when all
/// have arrived. Throws hetseq::PeerError naming the ranks missing after `timeout` (with
/// `what_to_check` appended), and hetseq::InputError with the message a rank left in `<name>/open`
/// (a duplicate rank). While it waits it says whom for, as `report` asks. See Note [Rendezvous keys].
void store_barrier(c10d::Store& store, const std::string& name, int64_t rank, int64_t world_size,
                   std::chrono::milliseconds timeout, const std::string& what_to_check,
                   const BarrierReport& report = {});

}  // namespace hetseq
