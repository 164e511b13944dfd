#pragma once
// Level 1 of STYLE's test levels: ranks as threads in one process, sharing a HashStore, each with its
// own Gloo process group over loopback. Catch2 assertions are not thread-safe: rank threads only
// record what they saw, the main thread checks it.

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hetseq/reduce/ddp_options.h"

namespace hetseq::test {

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;
using RankBody = std::function<void(int rank, const Group& group)>;

/// One intra-op thread while a test runs (the rank threads share the machine's cores); restores the
/// previous setting.
class OneIntraOpThread {
 public:
  OneIntraOpThread();
  ~OneIntraOpThread();
  OneIntraOpThread(const OneIntraOpThread&) = delete;
  OneIntraOpThread& operator=(const OneIntraOpThread&) = delete;

 private:
  int previous_;
};

/// Runs `body` on `world` threads, rank r with its own counting (hetseq::counting_backend) Gloo group of the given collective timeout over
/// one shared HashStore, and returns each rank's exception, `[rank]` (null when it returned normally).
/// Threads still running after 60 s abort the test program: a hang is a failure, never a pass.
std::vector<std::exception_ptr> run_ranks_collect(int world, const RankBody& body,
                                                  std::chrono::milliseconds timeout = std::chrono::seconds(10));

/// As run_ranks_collect, rethrowing in the calling thread the exception of the rank that failed first (the
/// cause, as a rule), with the other ranks' messages on stderr.
void run_ranks(int world, const RankBody& body);

/// Another Gloo group of the rank threads beside run_ranks' own (a host group: Note [Stat sync]), over `store`
/// (one the test shares between its rank threads) under `prefix`; every rank thread calls it at the same point.
/// Its first collective is enqueued under the mutex of run_ranks' own first ones (rank_threads.cpp).
Group second_group(int rank, int world, const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                   std::chrono::milliseconds timeout = std::chrono::seconds(10));

/// DdpOptions whose gradient buckets go through the process group, never through shared memory (ranks as
/// threads are on one machine, where --shared-memory-reduce auto would take it): for the tests that count the
/// group's collectives or break them.
inline hetseq::DdpOptions ddp_over_group() {
  hetseq::DdpOptions options;
  options.shared_memory = hetseq::SharedMemoryReduceMode::kOff;
  return options;
}

/// The what() of an exception.
std::string message_of(const std::exception_ptr& e);

/// Whether `e` holds an exception of type E (or derived from it).
template <class E>
bool is_a(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace hetseq::test
