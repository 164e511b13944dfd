#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hetseq/checkpoint/training_state.h"
#include "hetseq/reduce/ddp_options.h"

namespace hetseq {

/// What PowerSGD gradient compression needs from the command line. See Note [PowerSGD].
namespace detail {
struct PowerSgdBucket;
class CollectiveSequence;

/// The initial Q (m x rank, orthonormal columns, float32 on the CPU) of the gradient at `index` in
/// bucket `bucket`: the same on every rank for the same seed, drawn from a generator of its own (the
/// global RNG is neither read nor advanced). `rank` is the effective rank, min(rank, n, m).
/// PowerSgd calls it; tests rebuild the first approximation from it.
at::Tensor powersgd_initial_q(uint64_t seed, int64_t bucket, int64_t index, int64_t m, int64_t rank);
}  // namespace detail

/// PowerSGD (Vogels et al., 2019): each gradient bucket is summed over the ranks as a rank-`rank`
/// approximation, in two small allreduces instead of one of the whole bucket, with error feedback
/// and warm-started Q. The gradient reducer's comm hook calls it once per bucket.
/// See Note [PowerSGD].
///
/// Threads: begin_update and reduce are called from one thread at a time (the training or autograd
/// thread); the callbacks of different buckets may run concurrently on the backend's threads, each
/// touching only its own bucket's state. A bucket must not be reduced again before its previous
/// future has completed (the reducer waits for every bucket at the end of backward).
class PowerSgd {
 public:
  /// Throws hetseq::UsageError ("--powersgd-rank: ...") for rank < 1.
  PowerSgd(c10::intrusive_ptr<c10d::ProcessGroup> group, PowerSgdOptions options);
  ~PowerSgd();
  PowerSgd(const PowerSgd&) = delete;
  PowerSgd& operator=(const PowerSgd&) = delete;

  /// Once per update, before its first bucket (counts updates for start_update).
  void begin_update();
  /// Starts the approximate SUM over all ranks (no division by the world size) of one gradient
  /// bucket. `buffer` is the bucket's flat floating-point buffer, `grads` its per-parameter views into
  /// it, in bucket order (c10d::GradBucket::getGradients()), `bucket` its index (state is kept per
  /// bucket, and reset when the bucket's shapes change). Returns a future whose value is a
  /// one-element tensor list holding `buffer`, overwritten with the approximation of the sum; a
  /// failed collective completes it with a hetseq::InputError naming the rank and the bucket. Every
  /// rank calls it for the same buckets in the same order. Never blocks on communication.
  c10::intrusive_ptr<c10::ivalue::Future> reduce(int64_t bucket, at::Tensor buffer,
                                                 const std::vector<at::Tensor>& grads);

  /// Everything it keeps between updates, for a checkpoint (CPU copies). A collective over the group
  /// (a gather of the error feedback to rank 0, none before compression started): every rank calls it
  /// at the same point between updates, never while a reduction is in flight. Rank 0 gets every rank's
  /// error feedback; on the other ranks `errors` is empty. See Note [PowerSGD in checkpoints].
  PowerSgdState gather_state();
  /// Takes back a gather_state() read from the checkpoint `source`, before the first reduce(): the
  /// update count at once, each bucket's Q and this rank's error feedback at the bucket's first
  /// reduce(), where its gradients' shapes are known; a bucket saved for other shapes starts afresh,
  /// logged. See Note [PowerSGD in checkpoints].
  void load_state(PowerSgdState state, const std::string& source);

  /// The index of the current update (the number of begin_update calls minus one).
  int64_t update() const { return update_; }
  const PowerSgdOptions& options() const { return options_; }

 private:
  /// The state of `bucket`, rebuilt (zero error, initial Q) when its gradients' shapes are not those
  /// it was built for.
  std::shared_ptr<detail::PowerSgdBucket> bucket_state(int64_t bucket, const at::Tensor& buffer,
                                                       const std::vector<at::Tensor>& grads);

  /// Puts the saved state of one bucket into `state`, freshly built for the same bucket; returns why
  /// it does not fit (empty: restored). Called with mutex_ held.
  std::string restore_bucket(detail::PowerSgdBucket& state, const PowerSgdState::Bucket& saved) const;

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  PowerSgdOptions options_;
  int64_t update_ = -1;
  std::shared_ptr<detail::CollectiveSequence> sequence_;  // the order of this object's collectives
  std::mutex mutex_;  // guards buckets_ and the restored state
  std::unordered_map<int64_t, std::shared_ptr<detail::PowerSgdBucket>> buckets_;  // [bucket index]
  std::unordered_map<int64_t, PowerSgdState::Bucket> restored_;  // [bucket index] from load_state, not yet used
  int64_t restored_world_ = 1;  // the world size that restored_'s errors were saved by
  std::string restored_from_;   // the checkpoint they came from, for the log
};

}  // namespace hetseq
