#include "hetseq/world/rendezvous_keys.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <thread>
#include <vector>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {

// Note [Rendezvous keys]
// ~~~~~~~~~~~~~~~~~~~~~~
// Every key of a run lives under one prefix, hetseq/<run>/<attempt>/<generation>/: <run> is torchrun's
// TORCHELASTIC_RUN_ID or Slurm's job and step, <attempt> torchrun's restart count or Slurm's requeue
// count (store_prefix), and <generation> a token that the first rank 0 of the round sets with
// compareSet under hetseq/<run>/<attempt>/generation and that every rank reads; rank 0 deletes it
// when the round ends cleanly. A store that outlives a round (torchrun's agent store, which also
// serves the rounds of an elastic membership change within one attempt; a Slurm job's reused port;
// a shared file) then never shows one round's keys to the next, Gloo's connection keys included.
// The process group, the start handshake and the checkpoint fence all use the prefixed store.
//
// Arrival (store_barrier): a rank claims its rank with add("rank/<r>", 1) and writes "host pid W" under
// "rank/<r>/by/<n>" for the n it got back, then counts itself in with add("<barrier>/w<W>/count", 1);
// the rank that brings the count to W sets "<barrier>/w<W>/open", which every rank waits for (checking it
// until it is there: Note [Saying whom a barrier waits for]). Keys carry the world size W, so that ranks started with different
// --distributed-world-size never complete each other's barrier. A rank that gets n > 1 is a second
// worker with that rank: it writes the message naming both claims into "arrived/w<W>/open", so that
// every waiting rank fails with it at once, and fails itself. With file://, a claim whose process is
// gone on this host means the file is an earlier run's, and the message says to delete it. On a
// timeout, the per-rank keys "<barrier>/w<W>/<r>" name the ranks missing and their claims name those
// that came for another world size.

std::string store_prefix(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* key) {
    auto it = env.find(key);
    return it == env.end() ? std::string() : it->second;
  };
  std::string run = get("TORCHELASTIC_RUN_ID");
  std::string attempt = get("TORCHELASTIC_RESTART_COUNT");
  if (run.empty() && !get("SLURM_JOB_ID").empty()) {
    run = "slurm-" + get("SLURM_JOB_ID") + (get("SLURM_STEP_ID").empty() ? "" : "." + get("SLURM_STEP_ID"));
    attempt = get("SLURM_RESTART_COUNT");
  }
  if (run.empty()) run = "run";
  if (attempt.empty()) attempt = "0";
  return fmt::format("hetseq/{}/{}/", run, attempt);
}

RankClaim RankClaim::of_this_process(int64_t world_size) {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return RankClaim{name, static_cast<long>(::getpid()), world_size};
}

int64_t claim_rank(c10d::Store& store, int64_t rank, const RankClaim& claim) {
  const std::string key = fmt::format("rank/{}", rank);
  const int64_t n = store.add(key, 1);
  const std::string text = fmt::format("{} {} {}", claim.host, claim.pid, claim.world_size);
  store.set(fmt::format("{}/by/{}", key, n), std::vector<uint8_t>(text.begin(), text.end()));
  return n;
}

std::optional<RankClaim> read_rank_claim(c10d::Store& store, int64_t rank) {
  const std::string key = fmt::format("rank/{}/by/1", rank);
  if (!store.check({key})) return std::nullopt;
  const std::vector<uint8_t> bytes = store.get(key);
  RankClaim c;
  char host[256] = {};
  if (std::sscanf(std::string(bytes.begin(), bytes.end()).c_str(), "%255s %ld %" SCNd64, host, &c.pid,
                  &c.world_size) != 3) {
    return std::nullopt;
  }
  c.host = host;
  return c;
}

namespace {

// The ranks among [0, world_size) that have not set `key_prefix/<rank>`.
std::vector<int64_t> missing_ranks(c10d::Store& store, const std::string& key_prefix, int64_t world_size) {
  std::vector<int64_t> missing;
  for (int64_t r = 0; r < world_size; ++r) {
    if (!store.check({fmt::format("{}/{}", key_prefix, r)})) missing.push_back(r);
  }
  return missing;
}

}  // namespace

std::string rank_runs(const std::vector<int64_t>& ranks, bool bare_singles) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    runs.push_back(bare_singles && i == j ? fmt::format("{}", ranks[i]) : fmt::format("{}..{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return runs.empty() ? std::string("none") : fmt::format("{}", fmt::join(runs, ", "));
}

namespace {

// Note [Saying whom a barrier waits for]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A rank that waits at the start barrier for a node that was never started (a typo in the host, a job
// still queued) would otherwise be silent until --rendezvous-timeout, 300 s by default. So every
// BarrierReport::interval (RendezvousOptions::report_interval, 15 s) the waiting rank reads the per-rank
// keys and logs one line naming the ranks still missing, as runs ("1..1", "4..7"), the address, and the
// ranks there ("joined: 0, 2..3"). It logs as [rendezvous], so rank 0 says it (every rank with
// --log-all-ranks). The rank waits by checking the barrier's key, every 50 ms at most (sooner at first),
// not by a blocking wait cut into slices: a TCP store's client warns on every wait that times out (two
// lines of c10d's, from every rank, at each report), and check() says nothing. The start and the end of a
// run are the only places it waits so; the store serves those checks from memory.
void report_waiting(c10d::Store& store, const std::string& at, const std::string& name, int64_t world_size,
                    const BarrierReport& report) {
  const std::vector<int64_t> missing = missing_ranks(store, at, world_size);
  std::vector<int64_t> present;
  for (int64_t r = 0; r < world_size; ++r) {
    if (!std::binary_search(missing.begin(), missing.end(), r)) present.push_back(r);
  }
  log::info("[rendezvous] waiting for ranks {} of {} at {} ({}: {})", rank_runs(missing, false), world_size,
            report.address, name == "arrived" ? "joined" : name, rank_runs(present, true));
}

// Waits until "<at>/open" is set, at most `timeout`, saying whom it waits for as `report` asks; false on
// a timeout. See Note [Saying whom a barrier waits for].
bool await_open(c10d::Store& store, const std::string& at, const std::string& name, int64_t world_size,
                std::chrono::milliseconds timeout, const BarrierReport& report) {
  using std::chrono::milliseconds;
  const auto start = std::chrono::steady_clock::now();
  auto next_report = start + report.interval;
  milliseconds pause(1);
  while (!store.check({at + "/open"})) {
    const auto now = std::chrono::steady_clock::now();
    if (now - start >= timeout) return false;
    if (report.interval > milliseconds(0) && now >= next_report) {
      report_waiting(store, at, name, world_size, report);
      next_report += report.interval;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(50));
  }
  return true;
}

}  // namespace

void store_barrier(c10d::Store& store, const std::string& name, int64_t rank, int64_t world_size,
                   std::chrono::milliseconds timeout, const std::string& what_to_check, const BarrierReport& report) {
  const std::string at = fmt::format("{}/w{}", name, world_size);
  store.set(fmt::format("{}/{}", at, rank), std::vector<uint8_t>{1});
  if (store.add(at + "/count", 1) == world_size) {
    // Only if no duplicate rank has left its message there already.
    const std::string ok = "ok";
    store.compareSet(at + "/open", {}, std::vector<uint8_t>(ok.begin(), ok.end()));
  }
  bool opened = false;
  try {
    opened = await_open(store, at, name, world_size, timeout, report);
  } catch (const c10::Error&) {  // the store is gone (its host died): the missing ranks are named below
  }
  if (!opened) {
    std::vector<int64_t> missing = missing_ranks(store, at, world_size);
    std::string others;  // ranks that did arrive, but for a world of another size
    for (int64_t r : missing) {
      const std::optional<RankClaim> c = read_rank_claim(store, r);
      if (c && c->world_size != world_size) {
        others += fmt::format("; rank {} (host {} pid {}) was started with --distributed-world-size {}", r, c->host,
                              c->pid, c->world_size);
      }
    }
    throw PeerError(fmt::format("rank {}: rank(s) {} of {} {} within {} s{}{}", rank, fmt::join(missing, ", "),
                                world_size, name == "arrived" ? "never arrived" : "did not finish",
                                std::chrono::duration_cast<std::chrono::seconds>(timeout).count(), others,
                                what_to_check));
  }
  const std::vector<uint8_t> verdict = store.get(at + "/open");
  const std::string text(verdict.begin(), verdict.end());
  if (text != "ok") throw InputError(fmt::format("rank {}: {}", rank, text));
}

}  // namespace hetseq
