#pragma once
/// Sums gradient buckets over the ranks of one machine through shared memory instead of the process group
/// (--shared-memory-reduce). See Note [Shared-memory reduction] (shm_reduce.cpp); the segment and its barrier are
/// shm_segment.h. Internal: not installed.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue_inl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hetseq/reduce/shm_segment.h"

namespace hetseq {

class SharedMemoryReduce {
 public:
  /// Collective over `group` (every rank builds one at the same point): checks that every rank runs on this
  /// machine (hetseq::UsageError naming the flag and the first rank elsewhere otherwise), then rank 0 creates a
  /// segment for buckets of up to `max_bytes` and every rank maps it; the name is unlinked once all have, so the
  /// memory goes when the last process does, also after a crash. A wait for a peer longer than `timeout`
  /// throws hetseq::PeerError naming the ranks that did not arrive.
  /// `bucket_bytes`: room per rank for the gradient buckets in place (allreduce_bucket_async; 0: none).
  SharedMemoryReduce(c10d::ProcessGroup& group, size_t max_bytes, std::chrono::milliseconds timeout,
                     size_t bucket_bytes = 0);
  /// As the constructor, for --shared-memory-reduce auto: null, on every rank alike, where the ranks are not all
  /// on this machine, one of them is not `eligible` (its parameters are not on the CPU), or the segment cannot
  /// be made (`why` says which; `segment_failed`, where given, is set for the last: a full or small /dev/shm,
  /// which the caller should warn of, where the others are how the ranks were placed). Collective even where
  /// this rank is not eligible. `naming`: the words of its messages (Note [Options in the user's words]).
  static std::shared_ptr<SharedMemoryReduce> try_create(c10d::ProcessGroup& group, size_t max_bytes,
                                                        std::chrono::milliseconds timeout, bool eligible,
                                                        std::string* why, bool* segment_failed = nullptr,
                                                        size_t bucket_bytes = 0, Naming naming = Naming::kFlags);
  ~SharedMemoryReduce();
  SharedMemoryReduce(const SharedMemoryReduce&) = delete;
  SharedMemoryReduce& operator=(const SharedMemoryReduce&) = delete;

  /// Replaces `bucket` (contiguous, on the CPU, at most max_bytes) by its sum over the ranks, added in rank
  /// order, the same bits on every rank. `index` names the bucket in errors.
  void allreduce_sum(const at::Tensor& bucket, int64_t index);
  /// The same on this object's thread, in the order of the calls, so that the caller (backward) goes on; the
  /// future completes with [bucket], or with the PeerError.
  c10::intrusive_ptr<c10::ivalue::Future> allreduce_sum_async(const at::Tensor& bucket, int64_t index);

  /// The gradient buckets' sizes in bytes, [bucket index], the same on every rank: the layout of the buckets'
  /// own place in the segment (Note [Buckets in shared memory]), set again after a rebuild of the buckets.
  /// Buckets past the segment's bucket_bytes (given to the constructor) keep to the copying reduction.
  void set_bucket_layout(const std::vector<int64_t>& bytes);
  /// The ranks that take part in the reductions from now on, in rank order (all of them at first): a rank
  /// that sits out an update (Note [Sitting out]) adds nothing and waits for nothing; the chunks and the sums go
  /// over `members` only, in rank order. Every rank calls it at the same point between updates, with no
  /// reduction in flight; a rank not in `members` must not reduce until a later call names it.
  void set_members(const std::vector<int>& members);
  /// Whether `data` points into this segment (a bucket that lives there, or a gradient that views one).
  bool holds(const void* data) const;
  /// allreduce_sum_async for gradient bucket `index` of the layout: the first time, the bucket's storage (and
  /// so every gradient that views it) moves into the bucket's place in the segment, with its contents; from
  /// then on backward writes the gradients there and the sum is made in place, with no copy in or out. A
  /// bucket that does not fit the layout takes the copying path.
  c10::intrusive_ptr<c10::ivalue::Future> allreduce_bucket_async(const at::Tensor& bucket, int64_t index);

  size_t max_bytes() const { return max_bytes_; }

 private:
  SharedMemoryReduce(c10d::ProcessGroup& group, size_t max_bytes, std::chrono::milliseconds timeout, bool eligible,
                     std::string* why, size_t bucket_bytes, Naming naming);
  void barrier(int64_t index, const char* phase);
  char* slot(int half, int rank) const;
  char* bucket_place(int rank, int64_t index) const;  // where rank's bucket `index` lives
  void reduce_in_place(const at::Tensor& bucket, int64_t index);
  // Queues a reduction for the worker thread (started by the first); the future completes with [bucket].
  c10::intrusive_ptr<c10::ivalue::Future> enqueue(const at::Tensor& bucket, int64_t index, bool in_place);

  int rank_ = 0;
  int world_ = 1;
  std::vector<int> members_;  // the ranks that reduce, in rank order (set_members)
  int position_ = 0;          // this rank's index in members_ (-1: it sits out)
  size_t max_bytes_ = 0;     // per slot, rounded up to a page
  size_t bucket_bytes_ = 0;  // per rank, for the buckets in place (a multiple of the page)
  std::vector<size_t> bucket_offsets_;  // [bucket] its place within a rank's bucket room; the last entry: the end
  std::chrono::milliseconds timeout_;
  std::unique_ptr<SharedSegment> segment_;  // its mapping outlives this object while a bucket moved there lives
  uint64_t reductions_ = 0;  // reductions this rank has done (which half is next)

  struct Job {
    at::Tensor bucket;
    int64_t index;
    bool in_place;  // the bucket lives in the segment
    c10::intrusive_ptr<c10::ivalue::Future> done;
  };
  void work();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> jobs_;
  std::atomic<bool> stopping_{false};
  std::thread worker_;  // started by the first allreduce_sum_async
};

}  // namespace hetseq
