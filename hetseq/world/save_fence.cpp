#include "hetseq/world/save_fence.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/world/lost_peer.h"

namespace hetseq {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kBeat = std::chrono::milliseconds(500);  // a writing rank's heartbeat period
constexpr auto kPoll = std::chrono::milliseconds(50);   // how often the waiters look

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

int64_t whole_seconds(std::chrono::milliseconds d) { return std::chrono::duration_cast<std::chrono::seconds>(d).count(); }

// Adds 1 to `key` in the store every kBeat, on a thread of its own, until stop() or destruction.
class Heartbeat {
 public:
  Heartbeat(c10d::Store& store, std::string key) : store_(store), key_(std::move(key)), thread_([this] { beat(); }) {}
  ~Heartbeat() { stop(); }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void stop() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      finished_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void beat() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, kBeat, [&] { return finished_; })) {
      try {
        store_.add(key_, 1);
      } catch (const std::exception&) {
        return;  // the store is gone: the waiters will notice
      }
    }
  }

  c10d::Store& store_;
  std::string key_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool finished_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

// A waiter's view of one heartbeat: whether the count has stood still for longer than `liveness`.
struct BeatWatch {
  int64_t last = -1;
  Clock::time_point since;

  bool stalled(int64_t beat, Clock::time_point now, std::chrono::milliseconds liveness) {
    if (beat != last) {
      last = beat;
      since = now;
    }
    return now - since > liveness;
  }
};

}  // namespace

// Note [Checkpoint fence]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Only rank 0 writes a checkpoint, and the other ranks' next step is a collective, which would wait
// for rank 0 under --distributed-timeout: a save slower than that (multi-GB state on a shared
// filesystem) failed the run. So every rank passes a fence at each save point. Rank 0 writes while a
// thread adds 1 to "save/<id>.<n>/beat" every 0.5 s, then sets "save/<id>.<n>/done" to "ok", or to
// "lost <its error>" when it lost a peer meanwhile (a PeerError: Note [Lost writers]) and "failed <its
// error>" otherwise (n: the save points at update <id> before this one, prefix()).
// The others wait for "done" on the store, not in a collective: they give up only when the heartbeat
// has not moved for --distributed-timeout (rank 0 died or hangs: a lost peer, as a collective would
// have said) or the save has run past --checkpoint-timeout. A rank 0 that died while hosting the TCP
// store fails their next look at once. The fence costs one store round trip per rank and save.

// Note [Lost writers]
// ~~~~~~~~~~~~~~~~~~~
// In a sharded save every rank writes its own shard and rank 0 waits for their records (collect())
// inside the fence, under its own heartbeat, so the others wait for rank 0 as long as it waits. A
// writer that died there (SIGKILL, the OOM killer) once held the whole world for --checkpoint-timeout
// (an hour by default): rank 0 could not tell a dead writer from a slow one, and its heartbeat kept
// the others waiting. So each writer beats a heartbeat of its own ("save/<id>.<n>/part-beat/<rank>",
// every 0.5 s, from before its write until its record is posted), and rank 0 gives up on a rank whose
// count has not moved for --distributed-timeout: a PeerError naming that rank, which rank 0 hands on
// through "done" as "lost ...", so every rank exits with code 4 ("lost peer"), within
// --distributed-timeout of the death, as a collective would have.
// Why a heartbeat and not another liveness check: the store cannot say that a client went away (c10d's
// TCPStore keeps no per-rank sessions, and torchrun's agent store outlives the workers); a probe over
// the process group would be a collective, which is what the fence exists to avoid during a slow save;
// and a process check (kill(pid, 0)) sees only this host. The heartbeat is what rank 0 already offers
// the others, costs one store round trip per writer every 0.5 s, and tells "slow" (beating) from "dead"
// or "stuck" (silent) for any store and any host. A rank that dies after posting its record is waited
// for by no one in the fence: the ranks' next collective fails (Gloo sees the connection close at
// once; at worst --distributed-timeout), and that failure is a PeerError naming the collective too
// (wait_for_peers, Note [Lost peers in collectives]).

SaveFence::SaveFence(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t world_size,
                     std::chrono::milliseconds liveness, std::chrono::milliseconds limit)
    : store_(std::move(store)), rank_(rank), world_size_(world_size), liveness_(liveness), limit_(limit) {
  HETSEQ_ASSERT(store_, "SaveFence without a store");
}

std::string SaveFence::prefix(int64_t id) const {
  const auto it = runs_.find(id);
  return fmt::format("save/{}.{}", id, it == runs_.end() ? 0 : it->second);
}

void SaveFence::run(int64_t id, const std::function<void()>& write) {
  const std::string beat_key = prefix(id) + "/beat";
  const std::string done_key = prefix(id) + "/done";
  // Every rank counts the run, however it ends, so that the next save point with this id uses new keys.
  struct Count {
    std::map<int64_t, int64_t>& runs;
    int64_t id;
    ~Count() { ++runs[id]; }
  } count{runs_, id};
  if (rank_ == 0) {
    {
      Heartbeat heart(*store_, beat_key);
      try {
        write();
      } catch (const std::exception& e) {
        heart.stop();
        const bool lost = dynamic_cast<const PeerError*>(&e) != nullptr || is_lost_peer(e);
        store_->set(done_key, bytes_of(fmt::format("{} rank 0 could not write the checkpoint: {}",
                                                   lost ? "lost" : "failed", e.what())));
        throw;
      }
    }
    store_->set(done_key, bytes_of("ok"));
    return;
  }
  const auto start = Clock::now();
  BeatWatch rank0{-1, start};
  std::string text;
  try {
    while (!store_->check({done_key})) {
      const auto now = Clock::now();
      if (rank0.stalled(store_->add(beat_key, 0), now, liveness_)) {
        throw PeerError(fmt::format("rank {} of {}: rank 0 stopped showing progress while writing the checkpoint at "
                                    "update {} (no heartbeat for {} s, --distributed-timeout)",
                                    rank_, world_size_, id, whole_seconds(liveness_)));
      }
      if (now - start > limit_) {
        throw PeerError(fmt::format("rank {} of {}: rank 0 took more than --checkpoint-timeout {} s to write the "
                                    "checkpoint at update {}; raise --checkpoint-timeout for large models on slow disks",
                                    rank_, world_size_, whole_seconds(limit_), id));
      }
      std::this_thread::sleep_for(kPoll);
    }
    text = text_of(store_->get(done_key));
  } catch (const c10::Error& e) {
    throw PeerError(fmt::format("rank {} of {}: lost the store while rank 0 wrote the checkpoint at update {}: {}",
                                rank_, world_size_, id, e.what_without_backtrace()));
  }
  if (text != "ok") {
    const size_t space = text.find(' ');
    const std::string what = fmt::format("rank {} of {}: {}", rank_, world_size_, text.substr(space + 1));
    if (text.compare(0, space, "lost") == 0) throw PeerError(what);
    throw InputError(what);
  }
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  if (waited >= 1.0) {
    // A save long enough to notice: the user may want a faster --save-dir or fewer saves.
    log::info("[checkpoint] rank {} of {} waited {:.1f} s for rank 0 to write the checkpoint at update {}{}", rank_,
              world_size_, waited, id,
              waited > std::chrono::duration<double>(liveness_).count()
                  ? " (longer than --distributed-timeout; rank 0's heartbeat kept it waiting)"
                  : "");
  }
}

std::string SaveFence::share(int64_t id, const std::string& value) {
  const std::string key = prefix(id) + "/share";
  if (rank_ == 0) {
    store_->set(key, bytes_of(value));
    return value;
  }
  const auto start = Clock::now();
  try {
    while (!store_->check({key})) {
      if (Clock::now() - start > liveness_) {
        throw PeerError(fmt::format("rank {} of {}: rank 0 did not reach the checkpoint at update {} within "
                                    "--distributed-timeout {} s (it died or hangs)",
                                    rank_, world_size_, id, whole_seconds(liveness_)));
      }
      std::this_thread::sleep_for(kPoll);
    }
    return text_of(store_->get(key));
  } catch (const c10::Error& e) {
    throw PeerError(fmt::format("rank {} of {}: lost the store at the checkpoint at update {}: {}", rank_, world_size_,
                                id, e.what_without_backtrace()));
  }
}

void SaveFence::write_part(int64_t id, const std::function<std::string()>& write) {
  HETSEQ_ASSERT(rank_ != 0, "SaveFence::write_part on rank 0");
  std::string record;
  std::exception_ptr failed;
  {
    Heartbeat heart(*store_, fmt::format("{}/part-beat/{}", prefix(id), rank_));
    try {
      record = write();
    } catch (const std::exception& e) {
      record = fmt::format("error {}", e.what());
      failed = std::current_exception();
    }
  }
  try {
    store_->set(fmt::format("{}/part/{}", prefix(id), rank_), bytes_of(record));
  } catch (const c10::Error& e) {
    throw PeerError(fmt::format("rank {} of {}: lost the store while handing rank 0 its part of the checkpoint at "
                                "update {}: {}",
                                rank_, world_size_, id, e.what_without_backtrace()));
  }
  if (failed) std::rethrow_exception(failed);
}

std::vector<std::string> SaveFence::collect(int64_t id) {
  HETSEQ_ASSERT(rank_ == 0, "SaveFence::collect on rank {}", rank_);
  std::vector<std::string> records(static_cast<size_t>(world_size_));  // [rank]
  const auto start = Clock::now();
  std::vector<BeatWatch> writers(static_cast<size_t>(world_size_), BeatWatch{-1, start});  // [rank]
  std::vector<int64_t> pending;  // ranks whose record has not come
  for (int64_t r = 1; r < world_size_; ++r) pending.push_back(r);
  try {
    while (!pending.empty()) {
      const auto now = Clock::now();
      std::vector<int64_t> still;
      for (const int64_t r : pending) {
        const std::string key = fmt::format("{}/part/{}", prefix(id), r);
        if (store_->check({key})) {
          records[static_cast<size_t>(r)] = text_of(store_->get(key));
          continue;
        }
        const int64_t beat = store_->add(fmt::format("{}/part-beat/{}", prefix(id), r), 0);
        if (writers[static_cast<size_t>(r)].stalled(beat, now, liveness_)) {
          throw PeerError(fmt::format("rank 0 of {}: rank {} stopped showing progress while writing its part of the "
                                      "checkpoint at update {} (no heartbeat for {} s, --distributed-timeout): it died "
                                      "or hangs",
                                      world_size_, r, id, whole_seconds(liveness_)));
        }
        still.push_back(r);
      }
      pending = std::move(still);
      if (pending.empty()) break;
      if (now - start > limit_) {
        throw PeerError(fmt::format("rank 0 of {}: rank(s) {} did not write their part of the checkpoint at update {} "
                                    "within --checkpoint-timeout {} s",
                                    world_size_, fmt::join(pending, ", "), id, whole_seconds(limit_)));
      }
      std::this_thread::sleep_for(kPoll);
    }
  } catch (const c10::Error& e) {
    throw PeerError(fmt::format("rank 0 of {}: lost the store while collecting the ranks' parts of the checkpoint at "
                                "update {}: {}",
                                world_size_, id, e.what_without_backtrace()));
  }
  return records;
}

}  // namespace hetseq
