#include "hetseq/data/batch_loader.h"

#include <algorithm>

#include <torch/cuda.h>

#include "hetseq/core/error.h"

namespace hetseq {

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> dataset, BatchLoaderOptions options)
    : dataset_(std::move(dataset)), pin_memory_(options.pin_memory) {
  if (options.num_workers < 0) {
    throw UsageError(
        fmt::format("--num-workers: {} is negative; use 0 to load in the training thread", options.num_workers));
  }
  HETSEQ_ASSERT(!pin_memory_ || torch::cuda::is_available(),
                "a BatchLoader asked to pin batches where CUDA is not available (only a CUDA rank pins)");
  for (int64_t i = 0; i < options.num_workers; ++i) workers_.emplace_back([this] { work(); });
}

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> dataset, int64_t num_workers)
    : BatchLoader(std::move(dataset), BatchLoaderOptions{num_workers, false}) {}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& w : workers_) w.join();
}

std::future<Batch> BatchLoader::submit(std::vector<int64_t> indices) {
  auto build = [dataset = dataset_, pin = pin_memory_, indices = std::move(indices)] {
    Batch batch = dataset->collate(indices);
    return pin ? batch.pin_memory() : batch;  // See Note [Batches to the device].
  };
  if (workers_.empty()) return std::async(std::launch::deferred, std::move(build));  // built on get()
  std::packaged_task<Batch()> task(std::move(build));
  std::future<Batch> result = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  ready_.notify_one();
  return result;
}

void BatchLoader::work() {
  while (true) {
    std::packaged_task<Batch()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_ && queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // exceptions are stored in the future and rethrown by get()
  }
}

UpdateStream::UpdateStream(EpochBatchIterator iterator, std::shared_ptr<BatchLoader> loader, int64_t depth)
    : iterator_(std::move(iterator)),
      loader_(std::move(loader)),
      depth_(static_cast<size_t>(std::max<int64_t>(1, depth))),
      position_(iterator_.position()) {}

void UpdateStream::begin_epoch(int64_t epoch) {
  pending_.clear();
  iterator_.begin_epoch(epoch);
  position_ = iterator_.position();
  prefetch();
}

bool UpdateStream::end_of_epoch() const { return pending_.empty(); }

void UpdateStream::prefetch() {
  while (pending_.size() < depth_ && !iterator_.end_of_epoch()) {
    Prefetched update;
    update.start = iterator_.position();
    update.indices = iterator_.next_update();
    update.after = iterator_.position();
    for (const auto& indices : update.indices) update.batches.push_back(loader_->submit(indices));
    pending_.push_back(std::move(update));
  }
}

std::vector<Batch> UpdateStream::next() {
  HETSEQ_ASSERT(!pending_.empty(), "UpdateStream::next() past the end of epoch {}", iterator_.epoch());
  Prefetched current = std::move(pending_.front());
  pending_.pop_front();
  prefetch();
  std::vector<Batch> batches;
  batches.reserve(current.batches.size());
  for (auto& f : current.batches) batches.push_back(f.get());
  last_indices_ = std::move(current.indices);
  position_ = current.after;
  return batches;
}

void UpdateStream::restore(IteratorPosition position) {
  pending_.clear();
  iterator_.restore(position);
  position_ = position;
  prefetch();  // a no-op until begin_epoch() when `position` is in another epoch
}

void UpdateStream::set_plan(DataPlan plan) {
  const bool refill = !pending_.empty();
  if (refill) {
    iterator_.restore(pending_.front().start);
    pending_.clear();
  }
  iterator_.set_plan(std::move(plan));
  if (refill) prefetch();
}

int64_t UpdateStream::updates_left() const {
  return iterator_.updates_left() + static_cast<int64_t>(pending_.size());
}

}  // namespace hetseq
