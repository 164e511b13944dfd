#pragma once
/// What PowerSgd keeps per gradient bucket and the order of its collectives: shared by its reduction
/// (powersgd.cpp) and its checkpoint state (powersgd_state.cpp). Internal: not installed.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace hetseq {

namespace detail {

/// One compressed gradient view of a bucket.
struct PowerSgdMatrix {
  int64_t index = 0;  // position of the view in the bucket's gradients
  int64_t n = 0, m = 0, rank = 0;  // rows, columns, effective rank min(rank, n, m)
  at::Tensor q;       // m x rank: the summed Q of the last update (warm start)
  at::Tensor q0;      // m x rank: the initial Q
  at::Tensor error;   // n x m: this rank's error feedback
};

/// The state PowerSgd keeps for one bucket between updates.
struct PowerSgdBucket {
  std::vector<std::vector<int64_t>> shapes;  // [view] the shapes this state was built for
  at::ScalarType work_dtype = at::kFloat;    // the dtype of P, Q and the errors
  c10::Device device = c10::kCPU;
  std::vector<PowerSgdMatrix> matrices;      // [compressed view]
  std::vector<int64_t> plain;                // [uncompressed view] its position in the bucket
  int64_t p_numel = 0;                       // sum of n * rank
  int64_t q_numel = 0;                       // sum of m * rank
  int64_t plain_numel = 0;                   // elements of the uncompressed views
};

/// Issues collectives in ticket order, whichever thread gets to each first. See Note [PowerSGD].
class CollectiveSequence {
 public:
  /// Reserves `count` consecutive tickets; returns the first. Called in the same order on every rank.
  int64_t reserve(int64_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t first = reserved_;
    reserved_ += count;
    return first;
  }
  /// Runs `launch` once every ticket before `ticket` has run. `launch` must not throw. It runs either in
  /// this thread or in the thread that submits its predecessor.
  void submit(int64_t ticket, std::function<void()> launch) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.emplace(ticket, std::move(launch));
    if (draining_) return;  // the draining thread (maybe this one, further up the stack) runs it
    draining_ = true;
    for (auto it = ready_.find(next_); it != ready_.end(); it = ready_.find(next_)) {
      std::function<void()> run = std::move(it->second);
      ready_.erase(it);
      ++next_;
      lock.unlock();
      run();
      lock.lock();
    }
    draining_ = false;
  }

 private:
  std::mutex mutex_;
  int64_t reserved_ = 0;
  int64_t next_ = 0;  // the ticket that runs next
  bool draining_ = false;
  std::map<int64_t, std::function<void()>> ready_;  // [ticket] launches waiting for their turn
};

/// Ends the message of a failed PowerSGD collective: what may have caused it.
inline constexpr const char* kPowerSgdPeerHint =
    "(a peer died, fell behind past the process group's timeout, or ran a different number of backward passes)";

}  // namespace detail

}  // namespace hetseq
