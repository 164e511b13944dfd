#include "hetseq/distributed/save_fence.h"

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kBeat = std::chrono::milliseconds(500);  // rank 0's heartbeat period
constexpr auto kPoll = std::chrono::milliseconds(50);   // how often the others look

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

// Note [Checkpoint fence]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Only rank 0 writes a checkpoint, and the other ranks' next step is a collective, which would wait
// for rank 0 under --distributed-timeout: a save slower than that (multi-GB state on a shared
// filesystem) failed the run. So every rank passes a fence at each save point. Rank 0 writes while a
// thread adds 1 to "save/<id>.<n>/beat" every 0.5 s, then sets "save/<id>.<n>/done" to "ok" or to its
// error (n: the save points at update <id> before this one, prefix()).
// The others wait for "done" on the store, not in a collective: they give up only when the heartbeat
// has not moved for --distributed-timeout (rank 0 died or hangs: a lost peer, as a collective would
// have said) or the save has run past --checkpoint-timeout. A rank 0 that died while hosting the TCP
// store fails their next look at once. The fence costs one store round trip per rank and save.

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
    std::mutex mutex;
    std::condition_variable wake;
    bool finished = false;
    std::thread heart([&] {
      std::unique_lock<std::mutex> lock(mutex);
      while (!wake.wait_for(lock, kBeat, [&] { return finished; })) {
        try {
          store_->add(beat_key, 1);
        } catch (const std::exception&) {
          return;  // the store is gone: the others will notice
        }
      }
    });
    auto stop_heart = [&] {
      {
        const std::lock_guard<std::mutex> lock(mutex);
        finished = true;
      }
      wake.notify_all();
      heart.join();
    };
    try {
      write();
    } catch (const std::exception& e) {
      stop_heart();
      store_->set(done_key, bytes_of(fmt::format("rank 0 could not write the checkpoint: {}", e.what())));
      throw;
    }
    stop_heart();
    store_->set(done_key, bytes_of("ok"));
    return;
  }
  const auto start = Clock::now();
  int64_t last_beat = -1;
  auto last_change = start;
  try {
    while (!store_->check({done_key})) {
      const auto now = Clock::now();
      const int64_t beat = store_->add(beat_key, 0);
      if (beat != last_beat) {
        last_beat = beat;
        last_change = now;
      }
      if (now - last_change > liveness_) {
        throw PeerError(fmt::format("rank {} of {}: rank 0 stopped showing progress while writing the checkpoint at "
                                    "update {} (no heartbeat for {} s, --distributed-timeout)",
                                    rank_, world_size_, id,
                                    std::chrono::duration_cast<std::chrono::seconds>(liveness_).count()));
      }
      if (now - start > limit_) {
        throw PeerError(fmt::format("rank {} of {}: rank 0 took more than --checkpoint-timeout {} s to write the "
                                    "checkpoint at update {}; raise --checkpoint-timeout for large models on slow disks",
                                    rank_, world_size_,
                                    std::chrono::duration_cast<std::chrono::seconds>(limit_).count(), id));
      }
      std::this_thread::sleep_for(kPoll);
    }
  } catch (const c10::Error& e) {
    throw PeerError(fmt::format("rank {} of {}: lost the store while rank 0 wrote the checkpoint at update {}: {}",
                                rank_, world_size_, id, e.what_without_backtrace()));
  }
  const std::vector<uint8_t> verdict = store_->get(done_key);
  const std::string text(verdict.begin(), verdict.end());
  if (text != "ok") throw InputError(fmt::format("rank {} of {}: {}", rank_, world_size_, text));
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
      if (Clock::now() - start > limit_) {
        throw PeerError(fmt::format("rank {} of {}: rank 0 did not start the checkpoint at update {} within "
                                    "--checkpoint-timeout {} s",
                                    rank_, world_size_, id,
                                    std::chrono::duration_cast<std::chrono::seconds>(limit_).count()));
      }
      std::this_thread::sleep_for(kPoll);
    }
    const std::vector<uint8_t> got = store_->get(key);
    return std::string(got.begin(), got.end());
  } catch (const c10::Error& e) {
    throw PeerError(fmt::format("rank {} of {}: lost the store at the checkpoint at update {}: {}", rank_, world_size_,
                                id, e.what_without_backtrace()));
  }
}

void SaveFence::post(int64_t id, const std::string& record) {
  HETSEQ_ASSERT(rank_ != 0, "SaveFence::post on rank 0");
  store_->set(fmt::format("{}/part/{}", prefix(id), rank_), bytes_of(record));
}

std::vector<std::string> SaveFence::collect(int64_t id) {
  HETSEQ_ASSERT(rank_ == 0, "SaveFence::collect on rank {}", rank_);
  std::vector<std::string> records(static_cast<size_t>(world_size_));  // [rank]
  const auto start = Clock::now();
  for (int64_t r = 1; r < world_size_; ++r) {
    const std::string key = fmt::format("{}/part/{}", prefix(id), r);
    while (!store_->check({key})) {
      if (Clock::now() - start > limit_) {
        throw PeerError(fmt::format("rank {} did not write its part of the checkpoint at update {} within "
                                    "--checkpoint-timeout {} s",
                                    r, id, std::chrono::duration_cast<std::chrono::seconds>(limit_).count()));
      }
      std::this_thread::sleep_for(kPoll);
    }
    const std::vector<uint8_t> got = store_->get(key);
    records[static_cast<size_t>(r)] = std::string(got.begin(), got.end());
  }
  return records;
}

}  // namespace hetseq
