#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hetseq/data/dataset.h"
#include "hetseq/data/epoch_batch_iterator.h"

namespace hetseq {

/// How a BatchLoader builds batches.
struct BatchLoaderOptions {
  int64_t num_workers = 1;  // --num-workers: background threads (0: collate in the thread that calls get())
  /// Copy each batch into pinned host memory after collating it, where it was collated: for a CUDA rank,
  /// whose batches then go to the device asynchronously. Needs CUDA at run time. See Note [Batches to the
  /// device].
  bool pin_memory = false;
};

/// Collates batches on `num_workers` background threads (--num-workers), or in the calling thread
/// when it is 0. Each request returns its own future, so the order of batches never depends on which
/// worker finished first.
class BatchLoader {
 public:
  /// Throws hetseq::UsageError naming --num-workers when it is negative, and hetseq::InternalError when
  /// asked to pin memory where CUDA is not available.
  BatchLoader(std::shared_ptr<const Dataset> dataset, BatchLoaderOptions options);
  /// Unpinned batches on `num_workers` threads.
  BatchLoader(std::shared_ptr<const Dataset> dataset, int64_t num_workers);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// Starts building the batch of `indices`. With no workers, the batch is built on get().
  std::future<Batch> submit(std::vector<int64_t> indices);
  const Dataset& dataset() const { return *dataset_; }

 private:
  void work();

  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<Batch()>> queue_;
  bool stopping_ = false;
  bool pin_memory_ = false;
};

/// The training data of one rank, update by update: an EpochBatchIterator whose next `depth` updates
/// are collated in the background (their micro-batches on the loader's threads at once) while the
/// current one trains.
class UpdateStream {
 public:
  /// `depth` (at least 1): the updates collated ahead of the one being trained.
  UpdateStream(EpochBatchIterator iterator, std::shared_ptr<BatchLoader> loader, int64_t depth = 1);

  /// Starts `epoch` (see EpochBatchIterator::begin_epoch).
  void begin_epoch(int64_t epoch);
  bool end_of_epoch() const;
  /// This rank's micro-batches of the next update, in order (some may be empty at the epoch's end).
  std::vector<Batch> next();
  /// The sample indices of the update that next() returned last: [micro-batch][sample].
  const std::vector<std::vector<int64_t>>& last_indices() const { return last_indices_; }
  /// The position after the last update that next() returned: what a checkpoint stores.
  IteratorPosition position() const { return position_; }
  /// See EpochBatchIterator::restore.
  void restore(IteratorPosition position);
  /// Replaces the data plan from the next update on (drops the prefetched updates and collates them anew).
  void set_plan(DataPlan plan);
  const EpochBatchIterator& iterator() const { return iterator_; }
  /// Updates left in the current epoch, counting the prefetched ones.
  int64_t updates_left() const;

 private:
  /// An update on its way: where it starts, its samples and its micro-batches being collated.
  struct Prefetched {
    IteratorPosition start, after;
    std::vector<std::vector<int64_t>> indices;  // [micro-batch][sample]
    std::vector<std::future<Batch>> batches;    // [micro-batch]
  };
  /// Submits updates until `depth_` are on their way or the epoch has none left.
  void prefetch();

  EpochBatchIterator iterator_;
  std::shared_ptr<BatchLoader> loader_;
  size_t depth_;
  std::deque<Prefetched> pending_;                  // [update ahead], oldest first
  std::vector<std::vector<int64_t>> last_indices_;  // [micro-batch][sample] of the last update returned
  IteratorPosition position_;
};

}  // namespace hetseq
