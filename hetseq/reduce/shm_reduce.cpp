#include "hetseq/reduce/shm_reduce.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/reduce/ddp_options.h"

namespace hetseq {

// Note [Shared-memory reduction]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Gloo sends every byte of a CPU allreduce through its TCP transport, also between two ranks of one machine:
// loopback copies into and out of socket buffers in the kernel, chunk by chunk, with a wake-up for each. On
// the 2-CPU machine that is about 8 ms of kernel time per update of MNISTNet (4.8 MB of gradients) on the CPU
// that two ranks share, out of about 75 (docs/BENCHMARKS.md). With --shared-memory-reduce the ranks of one
// machine sum their buckets through a segment of shared memory (a /dev/shm file, mapped by every rank)
// instead; statistics, votes and everything else still use the process group.
//
// The segment has a header (a barrier) and two halves used by alternate reductions, each with one slot of
// max_bytes per rank. The bucket's n elements are cut into W chunks (about n / W each, cut at 64-byte
// boundaries); chunk r is rank r's to sum. One reduction:
//   1. each rank copies every chunk of its bucket but its own into its slot of the half;
//   2. barrier;
//   3. rank r adds chunk r of every rank's contribution, in rank order ((s0 + s1) + s2 ...), its own read from
//      its bucket, the others' from their slots, into slot 0's chunk r (which rank 0 left free in step 1 where
//      r is 0, and whose rank-0 term is read before it is overwritten otherwise), then copies that sum into
//      its bucket's chunk r: in this phase only rank r touches chunk r of any slot;
//   4. barrier;
//   5. each rank copies the other chunks of slot 0 into its bucket.
// Rank r's own chunk never goes through shared memory but as the sum: per rank and reduction of B bytes, the
// copies in and out move B (W - 1) / W each rather than B, a quarter less memory traffic in all with two
// ranks (4 B rather than 5.5 B read and written), which is what bounds the reduction (docs/BENCHMARKS.md).
// Every rank gets the same bits, and the same as in any other run, since each chunk is added once, in rank
// order, whatever the timing (a term's bits are the same read from the bucket or from its copy). The next
// reduction uses the other half; the one after it comes back to this half only after its own step 2, which
// no rank passes before every rank has finished step 5 here. So two barriers a reduction suffice.
//
// The segment, its creation and the barrier (a count and a generation word, with a futex; a dead peer is an
// error, not a hang) are SharedSegment's (Note [A segment and its barrier], shm_segment.cpp). The sums go through
// the bucket's own dtype (float32 for the default hook), with LibTorch's add on views of the slots.

// Note [Buckets in shared memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The reduction above copies each bucket into the segment and the sum back out: per rank and bucket of B
// bytes, about 4 B of memory traffic with two ranks, which bounds it (on the 2-CPU machine, about 1.8 ms of
// each MNIST update on the reducer's thread). The gradient buckets of the training run go without those
// copies: the segment also has, per rank, a place for every bucket of the reducer's layout (set_bucket_layout:
// the buckets in index order, each at a 64-byte boundary; the same on every rank). The first time bucket i
// comes to allreduce_bucket_async, its storage moves there: its bytes are copied to the place and the storage's
// data pointer is swapped for the place (StorageImpl::set_data_ptr_noswap), so every tensor that views the
// storage -- the Reducer's bucket views and, with gradient_as_bucket_view, the parameters' gradients -- now
// reads and writes the segment, and backward writes the next update's gradients straight there. The data
// pointer holds the mapping alive, so a gradient outlives this object safely. One reduction of bucket i:
//   1. barrier (every rank's bucket i is written);
//   2. rank r adds chunk r (as above) of every rank's bucket i, in rank order, in blocks small enough for the
//      L1 cache, and writes each block of the sum into chunk r of every rank's bucket i;
//   3. barrier.
// Per rank, B read and B written: half the traffic of the copying reduction, with the same bits (each chunk
// is the same sum in rank order). No place is touched out of turn: between its barriers, only rank r touches
// chunk r of any rank's bucket i; before barrier 1 only rank s writes its own bucket i (backward), and it
// writes it again only in the next update's backward, after barrier 3, by which every rank has finished
// writing the sum into it. Places are per bucket, so the halves of the copying reduction are not needed.
// A rebuild of the buckets (after the first update, Note [Bucketed reduction]) sets the layout again; the
// reducer first moves any gradient still in the old places to memory of its own, since the new places may
// overlap the old. A bucket that fits no place (a size the layout did not announce) takes the copying path,
// the same decision on every rank.

namespace {

constexpr size_t kPage = SharedSegment::kPage;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Rank `rank`'s chunk of n elements, [lo, hi): about n / world each, cut at multiples of 16 elements (64 bytes
// of float32).
std::pair<int64_t, int64_t> chunk_of(int64_t n, int rank, int world) {
  const int64_t per = (n + world - 1) / world;
  const int64_t step = (per + 15) / 16 * 16;
  const int64_t lo = std::min<int64_t>(n, step * rank), hi = std::min<int64_t>(n, lo + step);
  return {lo, hi};
}

}  // namespace

SharedMemoryReduce::SharedMemoryReduce(c10d::ProcessGroup& group, size_t max_bytes, std::chrono::milliseconds timeout,
                                       size_t bucket_bytes)
    : SharedMemoryReduce(group, max_bytes, timeout, true, nullptr, bucket_bytes, Naming::kFlags) {}

std::shared_ptr<SharedMemoryReduce> SharedMemoryReduce::try_create(c10d::ProcessGroup& group, size_t max_bytes,
                                                                   std::chrono::milliseconds timeout, bool eligible,
                                                                   std::string* why, bool* segment_failed,
                                                                   size_t bucket_bytes, Naming naming) {
  std::string reason;
  std::shared_ptr<SharedMemoryReduce> shm(
      new SharedMemoryReduce(group, max_bytes, timeout, eligible, &reason, bucket_bytes, naming));
  if (segment_failed) *segment_failed = shm->segment_->segment_failed();
  if (!reason.empty()) {
    if (why) *why = reason;
    return nullptr;
  }
  return shm;
}

// `why` null: what stops it is a UsageError; otherwise it is written there and the object is left unmapped.
SharedMemoryReduce::SharedMemoryReduce(c10d::ProcessGroup& group, size_t max_bytes, std::chrono::milliseconds timeout,
                                       bool eligible, std::string* why, size_t bucket_bytes, Naming naming)
    : rank_(group.getRank()), world_(group.getSize()), timeout_(timeout) {
  auto fail = [&](const std::string& message) {
    if (!why) throw UsageError(fmt::format("{}: {}", kSharedMemoryOption.set_to(naming, "on"), message));
    *why = message;
  };
  max_bytes_ = round_up(std::max<size_t>(max_bytes, 64), kPage);
  bucket_bytes_ = round_up(bucket_bytes, kPage);
  segment_ = std::make_unique<SharedSegment>(
      group, static_cast<size_t>(world_) * (2 * max_bytes_ + bucket_bytes_), eligible, fail, naming);
  if (!segment_->mapped()) return;
  for (int r = 0; r < world_; ++r) members_.push_back(r);
  position_ = rank_;
}

SharedMemoryReduce::~SharedMemoryReduce() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;  // a barrier that waits gives up within 100 ms
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  segment_.reset();  // unmapped here unless a bucket still lives in the segment
}

c10::intrusive_ptr<c10::ivalue::Future> SharedMemoryReduce::allreduce_sum_async(const at::Tensor& bucket,
                                                                                 int64_t index) {
  return enqueue(bucket, index, /*in_place=*/false);
}

c10::intrusive_ptr<c10::ivalue::Future> SharedMemoryReduce::enqueue(const at::Tensor& bucket, int64_t index,
                                                                     bool in_place) {
  auto done = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    jobs_.push_back(Job{bucket, index, in_place, done});
  }
  wake_.notify_one();
  return done;
}

void SharedMemoryReduce::set_bucket_layout(const std::vector<int64_t>& bytes) {
  bucket_offsets_.assign(1, 0);
  for (int64_t b : bytes) bucket_offsets_.push_back(bucket_offsets_.back() + round_up(static_cast<size_t>(b), 64));
}

void SharedMemoryReduce::set_members(const std::vector<int>& members) {
  HETSEQ_ASSERT(!members.empty() && std::is_sorted(members.begin(), members.end()) && members.front() >= 0 &&
                    members.back() < world_,
                "shared-memory reduction: members [{}] of a world of {}", fmt::join(members, ","), world_);
  std::lock_guard<std::mutex> lock(mutex_);
  HETSEQ_ASSERT(jobs_.empty(), "shared-memory reduction: members changed with {} reductions queued", jobs_.size());
  members_ = members;
  const auto at = std::find(members_.begin(), members_.end(), rank_);
  position_ = at == members_.end() ? -1 : static_cast<int>(at - members_.begin());
  // Counted afresh from here on, the same on every member (Note [Sharing an update]).
  reductions_ = 0;
  segment_->restart_count();
}

bool SharedMemoryReduce::holds(const void* data) const { return segment_ && segment_->holds(data); }

char* SharedMemoryReduce::bucket_place(int rank, int64_t index) const {
  return segment_->data() + static_cast<size_t>(world_) * 2 * max_bytes_ +
         static_cast<size_t>(rank) * bucket_bytes_ + bucket_offsets_[static_cast<size_t>(index)];
}

c10::intrusive_ptr<c10::ivalue::Future> SharedMemoryReduce::allreduce_bucket_async(const at::Tensor& bucket,
                                                                                    int64_t index) {
  const size_t bytes = static_cast<size_t>(bucket.numel()) * bucket.element_size();
  const auto i = static_cast<size_t>(index);
  // The same answer on every rank: the layout, the bucket's size and how the Reducer allocated it are.
  const bool fits = index >= 0 && i + 1 < bucket_offsets_.size() && bucket_offsets_[i + 1] <= bucket_bytes_ &&
                    bucket_offsets_[i + 1] - bucket_offsets_[i] == round_up(bytes, 64) && bucket.device().is_cpu() &&
                    bucket.is_contiguous() && bucket.storage_offset() == 0 && bucket.storage().nbytes() == bytes;
  if (!fits) return enqueue(bucket, index, /*in_place=*/false);
  char* place = bucket_place(rank_, index);
  if (bucket.data_ptr() != place) {
    // Move the storage into its place (Note [Buckets in shared memory]); the old memory goes with its DataPtr.
    std::memcpy(place, bucket.data_ptr(), bytes);
    auto* keep = new std::shared_ptr<SharedSegment::Mapping>(segment_->mapping());
    bucket.storage().unsafeGetStorageImpl()->set_data_ptr_noswap(
        c10::DataPtr(place, keep, [](void* ctx) { delete static_cast<std::shared_ptr<SharedSegment::Mapping>*>(ctx); },
                     c10::Device(c10::kCPU)));
  }
  return enqueue(bucket, index, /*in_place=*/true);
}

void SharedMemoryReduce::work() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      job.in_place ? reduce_in_place(job.bucket, job.index) : allreduce_sum(job.bucket, job.index);
      job.done->markCompleted(c10::IValue(std::vector<at::Tensor>{job.bucket}));
    } catch (...) {
      job.done->setError(std::current_exception());
    }
  }
}

char* SharedMemoryReduce::slot(int half, int rank) const {
  return segment_->data() +
         (static_cast<size_t>(half) * static_cast<size_t>(world_) + static_cast<size_t>(rank)) * max_bytes_;
}

void SharedMemoryReduce::barrier(int64_t index, const char* phase) {
  segment_->barrier(members_, timeout_, index, phase, stopping_);
}

void SharedMemoryReduce::allreduce_sum(const at::Tensor& bucket, int64_t index) {
  const size_t bytes = static_cast<size_t>(bucket.numel()) * bucket.element_size();
  HETSEQ_ASSERT(bucket.is_contiguous() && bucket.device().is_cpu(), "bucket {} is not a contiguous CPU tensor", index);
  HETSEQ_ASSERT(bytes <= max_bytes_, "bucket {} has {} bytes, more than the {} of a shared-memory slot", index, bytes,
                max_bytes_);
  HETSEQ_ASSERT(position_ >= 0, "rank {} reduces a bucket while it sits out", rank_);
  if (members_.size() == 1) return;  // the sum is the bucket, and the chunks below assume a second rank
  const int members = static_cast<int>(members_.size());
  const int first = members_[0];
  const int half = static_cast<int>(reductions_++ % 2);
  const auto options = bucket.options();
  const int64_t n = bucket.numel();
  auto view = [&](int rank, int64_t from, int64_t count) {
    return at::from_blob(slot(half, rank) + static_cast<size_t>(from) * bucket.element_size(), {count}, options);
  };
  const at::Tensor flat = bucket.view({n});
  const auto [lo, hi] = chunk_of(n, position_, members);
  // The bucket's elements but [lo, hi), copied between the bucket and `rank`'s slot.
  auto copy_others = [&](int rank, bool into_slot) {
    for (auto [from, to] : {std::pair<int64_t, int64_t>{0, lo}, std::pair<int64_t, int64_t>{hi, n}}) {
      if (to <= from) continue;
      at::Tensor shared = view(rank, from, to - from), own = flat.narrow(0, from, to - from);
      into_slot ? shared.copy_(own) : own.copy_(shared);
    }
  };
  copy_others(rank_, /*into_slot=*/true);
  barrier(index, "copy in");
  if (hi > lo) {
    // Rank k's term of chunk r: this rank's from its bucket, the others' from their slots.
    auto term = [&](int k) { return k == rank_ ? flat.narrow(0, lo, hi - lo) : view(k, lo, hi - lo); };
    at::Tensor sum = view(first, lo, hi - lo);
    if (rank_ == first) {
      at::add_out(sum, term(first), term(members_[1]));  // the first member left this chunk of its slot free
    } else {
      sum.add_(term(members_[1]));  // the first member copied its term there in step 1
    }
    for (int k = 2; k < members; ++k) sum.add_(term(members_[static_cast<size_t>(k)]));
    flat.narrow(0, lo, hi - lo).copy_(sum);
  }
  barrier(index, "sum");
  copy_others(first, /*into_slot=*/false);
}

void SharedMemoryReduce::reduce_in_place(const at::Tensor& bucket, int64_t index) {
  HETSEQ_ASSERT(position_ >= 0, "rank {} reduces a bucket while it sits out", rank_);
  // A world of one (a torchrun job shrunk to one node), or one rank left to train: the sum is the bucket.
  if (members_.size() == 1) return;
  barrier(index, "gradients written");
  const int64_t n = bucket.numel();
  const int members = static_cast<int>(members_.size());
  const auto [lo, hi] = chunk_of(n, position_, members);
  if (hi > lo) {
    const size_t element = bucket.element_size();
    std::vector<char*> term(static_cast<size_t>(members));  // [member] its bucket's chunk
    for (int k = 0; k < members; ++k) {
      term[static_cast<size_t>(k)] = bucket_place(members_[static_cast<size_t>(k)], index) + static_cast<size_t>(lo) * element;
    }
    const int64_t m = hi - lo;
    if (bucket.scalar_type() == at::kFloat) {
      // Block by block: the sum in rank order into a block that stays in the L1 cache, then the block out to
      // every rank's bucket.
      constexpr int64_t kBlock = 2048;
      float sum[kBlock];
      for (int64_t from = 0; from < m; from += kBlock) {
        const int64_t count = std::min(kBlock, m - from);
        const float* a = reinterpret_cast<const float*>(term[0]) + from;
        const float* b = reinterpret_cast<const float*>(term[1]) + from;
        for (int64_t e = 0; e < count; ++e) sum[e] = a[e] + b[e];
        for (int k = 2; k < members; ++k) {
          const float* c = reinterpret_cast<const float*>(term[static_cast<size_t>(k)]) + from;
          for (int64_t e = 0; e < count; ++e) sum[e] += c[e];
        }
        for (int k = 0; k < members; ++k) {
          std::memcpy(reinterpret_cast<float*>(term[static_cast<size_t>(k)]) + from, sum,
                      static_cast<size_t>(count) * sizeof(float));
        }
      }
    } else {
      auto view = [&](int k) { return at::from_blob(term[static_cast<size_t>(k)], {m}, bucket.options()); };
      at::Tensor sum = at::add(view(0), view(1));
      for (int k = 2; k < members; ++k) sum.add_(view(k));
      for (int k = 0; k < members; ++k) view(k).copy_(sum);
    }
  }
  barrier(index, "sum");
}

}  // namespace hetseq
