#include "hetseq/data/epoch_batch_iterator.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "hetseq/core/error.h"

namespace hetseq {
namespace {

// A uniform integer in [0, bound) from a 64-bit engine, without modulo bias. Written out instead of
// std::uniform_int_distribution so that the order is the same with every standard library.
uint64_t uniform_below(std::mt19937_64& engine, uint64_t bound) {
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  uint64_t x;
  do {
    x = engine();
  } while (x >= limit);
  return x % bound;
}

}  // namespace

EpochBatchIterator::EpochBatchIterator(int64_t dataset_size, DataPlan plan, EpochIteratorOptions options)
    : dataset_size_(dataset_size), plan_(std::move(plan)), options_(options) {
  plan_.validate(options_.naming);
  if (dataset_size_ <= 0) {
    throw InputError(fmt::format("the dataset is empty ({} samples); check {}", dataset_size_,
                                 options_.naming == Naming::kPython ? "dataset_size" : "--data"));
  }
}

std::vector<int64_t> EpochBatchIterator::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle && epoch > options_.curriculum) {
    std::seed_seq seq{static_cast<uint32_t>(options_.seed), static_cast<uint32_t>(options_.seed >> 32),
                      static_cast<uint32_t>(epoch), static_cast<uint32_t>(static_cast<uint64_t>(epoch) >> 32)};
    std::mt19937_64 engine(seq);
    for (int64_t i = dataset_size_ - 1; i > 0; --i) {
      std::swap(order[i], order[uniform_below(engine, static_cast<uint64_t>(i) + 1)]);
    }
  }
  return order;
}

void EpochBatchIterator::begin_epoch(int64_t epoch) {
  HETSEQ_ASSERT(epoch >= 1, "epochs count from 1, got {}", epoch);
  if (restored_ && epoch == position_.epoch) {
    restored_ = false;
  } else {
    restored_ = false;
    position_ = IteratorPosition{epoch, 0};
  }
  order_ = epoch_order(epoch);
  started_ = true;
}

bool EpochBatchIterator::end_of_epoch() const { return !started_ || position_.offset >= dataset_size_; }

std::vector<std::vector<int64_t>> EpochBatchIterator::next_update() {
  HETSEQ_ASSERT(!end_of_epoch(), "next_update() past the end of epoch {}", position_.epoch);
  const int64_t rank = plan_.rank;
  const int64_t u = plan_.update_freqs[rank];
  const int64_t begin = position_.offset + plan_.slice_offset(rank);
  std::vector<std::vector<int64_t>> micro_batches(u);
  for (int64_t k = 0; k < u; ++k) {
    const int64_t lo = std::min(begin + plan_.micro_batch_begin(rank, k), dataset_size_);
    const int64_t hi = std::min(begin + plan_.micro_batch_begin(rank, k + 1), dataset_size_);
    micro_batches[k].assign(order_.begin() + lo, order_.begin() + hi);
  }
  position_.offset = std::min(position_.offset + plan_.samples_per_update(), dataset_size_);
  return micro_batches;
}

int64_t EpochBatchIterator::updates_left() const {
  if (end_of_epoch()) return 0;
  const int64_t per = plan_.samples_per_update();
  return (dataset_size_ - position_.offset + per - 1) / per;
}

int64_t EpochBatchIterator::updates_per_epoch() const {
  const int64_t per = plan_.samples_per_update();
  return (dataset_size_ + per - 1) / per;
}

void EpochBatchIterator::restore(IteratorPosition position) {
  if (position.epoch < 1 || position.offset < 0 || position.offset > dataset_size_) {
    throw InputError(fmt::format("cannot restore the data position (epoch {}, offset {}): the dataset has {} "
                                 "samples; {}",
                                 position.epoch, position.offset, dataset_size_,
                                 options_.naming == Naming::kPython
                                     ? "was it saved over another dataset? Leave plan= out of "
                                       "hetseq.checkpoint.load to start the plan afresh"
                                     : "pass --reset-dataloader to start the epoch afresh"));
  }
  if (started_ && position.epoch == position_.epoch) {
    position_ = position;
    return;
  }
  position_ = position;
  restored_ = true;
  started_ = false;
}

void EpochBatchIterator::set_plan(DataPlan plan) {
  plan.validate(options_.naming);
  plan_ = std::move(plan);
}

}  // namespace hetseq
