#include "support/rank_threads.h"

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>

#include "hetseq/world/process_group.h"
#include "support/counting_backend.h"

namespace hetseq::test {
namespace {

constexpr auto kDeadline = std::chrono::seconds(60);

struct Counter {
  std::mutex mutex;
  std::condition_variable cv;
  int count = 0;
};

// LibTorch 2.11 races when several process groups in one process start their first collective at the
// same time from different threads: FlightRecorder::recordWithResetEnabled (FlightRecorderDetail.hpp)
// inserts the group into a process-wide std::map before it takes its mutex, and the tests crashed in
// that insert about once in 30 runs. Each rank thread therefore enqueues its first collective under one
// mutex, and none goes on before all have (later collectives of a group only read that map).
// The first collective of `group`, enqueued under the one mutex of every group of the process, and waited for.
void first_allreduce(const Group& group) {
  static std::mutex first_enqueue;
  c10::intrusive_ptr<c10d::Work> work;
  {
    std::lock_guard<std::mutex> lock(first_enqueue);
    std::vector<torch::Tensor> tensors{torch::zeros({1})};
    work = group->allreduce(tensors);
  }
  work->wait();
}

void first_collective(const Group& group, int world, Counter& started, std::chrono::milliseconds timeout) {
  first_allreduce(group);
  std::unique_lock<std::mutex> lock(started.mutex);
  ++started.count;
  started.cv.notify_all();
  if (!started.cv.wait_for(lock, timeout, [&] { return started.count == world; })) {
    throw std::runtime_error("rank threads did not all start their process groups");
  }
}

// Each rank's exception, [rank], and the ranks that threw in the order they did (the first is usually the
// cause; the others then fail in their collectives with the first one's peer gone).
std::vector<std::exception_ptr> collect(int world, const RankBody& body, std::chrono::milliseconds timeout,
                                        std::vector<int>& order) {
  // Gloo writes to its peers' sockets with writev, so a write to a peer that has closed its group
  // raises SIGPIPE, which kills the process silently (exit 141) instead of failing the collective.
  // Python ignores SIGPIPE at startup, which is why PyTorch users never see this; a C++ program must
  // ignore it itself.
  std::signal(SIGPIPE, SIG_IGN);
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto started = std::make_shared<Counter>();
  auto finished = std::make_shared<Counter>();
  std::vector<std::exception_ptr> errors(world);  // [rank]
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r, started, finished] {
      try {
        hetseq::ProcessGroupOptions options;
        options.timeout = timeout;
        options.wrap_backend = hetseq::count_collectives;  // tests count collectives from outside
        Group group = hetseq::make_process_group(store, r, world, options);
        first_collective(group, world, *started, timeout);
        body(r, group);
      } catch (...) {
        errors[r] = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(finished->mutex);
      if (errors[r]) order.push_back(r);
      ++finished->count;
      finished->cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(finished->mutex);
    if (!finished->cv.wait_for(lock, kDeadline, [&] { return finished->count == world; })) {
      std::fprintf(stderr, "[rank threads] rank threads still running after %lld s: a collective hung\n",
                   static_cast<long long>(kDeadline.count()));
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

OneIntraOpThread::OneIntraOpThread() : previous_(torch::get_num_threads()) { torch::set_num_threads(1); }
OneIntraOpThread::~OneIntraOpThread() { torch::set_num_threads(previous_); }

std::vector<std::exception_ptr> run_ranks_collect(int world, const RankBody& body, std::chrono::milliseconds timeout) {
  std::vector<int> order;
  return collect(world, body, timeout, order);
}

void run_ranks(int world, const RankBody& body) {
  std::vector<int> order;
  const auto errors = collect(world, body, std::chrono::seconds(10), order);
  if (order.empty()) return;
  for (size_t i = 1; i < order.size(); ++i) {
    std::fprintf(stderr, "[rank threads] rank %d failed after rank %d: %s\n", order[i], order.front(),
                 message_of(errors[static_cast<size_t>(order[i])]).c_str());
  }
  std::rethrow_exception(errors[static_cast<size_t>(order.front())]);
}

Group second_group(int rank, int world, const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                   std::chrono::milliseconds timeout) {
  hetseq::ProcessGroupOptions options;
  options.timeout = timeout;
  Group group = hetseq::make_process_group(c10::make_intrusive<c10d::PrefixStore>(prefix, store), rank, world, options);
  first_allreduce(group);
  return group;
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

}  // namespace hetseq::test
