#include "hetseq/shard/shard_reducer.h"

#include <algorithm>
#include <chrono>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/world/lost_peer.h"

namespace hetseq {

// Note [Sharded gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Under --zero-sharding os+grad a rank keeps, after the reduction, only its shard of the summed gradients:
// the elements [first_r, first_r + numel_r) of the flat space in which Note [Sharded optimizer state] lays the
// parameters end to end, cut in proportion to the memory budgets. That is all its optimizer step reads.
//
// The buckets. The flat space is cut at the shard boundaries, and each shard into buckets of at most --bucket-cap-mb
// and at most 1/(8 W) of the gradients (shard_bucket_bytes), from the end of the flat space to its start (the order
// in which backward produces the gradients), so that every bucket has one owner. In the update's last backward
// (earlier micro-batches only accumulate into .grad, as without sharding), a hook on each parameter's gradient
// accumulator counts the parameter done; a bucket whose parameters are all done is copied into a buffer and gathered
// to its owner (the process group's gather), and a parameter's .grad is freed once every bucket it touches has been
// copied. Buckets are launched strictly in their order, on every rank alike, whatever order the gradients complete
// in: c10d matches collectives by their order. At most two buckets are in flight; a third waits for the oldest.
// finish_update() launches what is left (a parameter with no gradient on this rank gives zeros), finishes every
// bucket and frees every .grad. So a rank holds, besides its shard, the gradients of the buckets being filled and at
// most two buckets in flight (with W copies each on their owner).
//
// The sum. The owner adds the W copies of a bucket in rank order, ((g_0 + g_1) + g_2) ..., into its shard:
// the order of the shared-memory reduction (Note [Shared-memory reduction]), so that on one machine the
// shard holds the bits of --zero-sharding none's allreduce there. (A reduce would leave the order to the
// backend, and the weights would drift from none's by rounding, which Adam amplifies where a gradient's
// terms cancel: about 1e-3 relative after 30 updates of MNIST.) Gloo's ring allreduce between machines adds
// in another order; there the two modes agree within rounding.
//
// The norm and the clip. The Controller divides the shard by the update's samples and takes its norm; the
// strategy sums the squares of every rank's norm with one allreduce (GradientSharding::global_norm), so
// the clip factor is the global one on every rank, within float64 rounding of none's (the partial norms
// are combined in another order), far below what changes its float32 value. The division, the clip and
// the optimizer are elementwise (Note [Sharded optimizer state]), so the 3-process test
// (tests/shard/test_zero_sharding.cpp) finds the weights of none bit for bit after 30 Adam updates
// with clipping. A parameter with no gradient on any rank gets a zero gradient (--find-unused-parameters is
// refused).

namespace {

// The buckets of `plan`'s shards, each within one shard and at most `cap` elements, from the end of the flat
// space to its start.
std::vector<ShardReducer::Bucket> cut_buckets(const std::vector<ShardRange>& plan, int64_t cap) {
  std::vector<ShardReducer::Bucket> buckets;
  for (int64_t r = static_cast<int64_t>(plan.size()) - 1; r >= 0; --r) {
    const ShardRange& s = plan[static_cast<size_t>(r)];
    for (int64_t end = s.first + s.numel; end > s.first;) {
      const int64_t first = std::max(s.first, end - cap);
      buckets.push_back(ShardReducer::Bucket{first, end - first, r});
      end = first;
    }
  }
  return buckets;
}

}  // namespace

int64_t shard_bucket_bytes(int64_t total_bytes, int64_t world, int64_t cap_bytes) {
  const int64_t part = (total_bytes + 8 * world - 1) / (8 * world);
  return std::max<int64_t>(64 << 10, std::min(cap_bytes, part));
}

ShardReducer::ShardReducer(std::vector<torch::Tensor> params, std::vector<torch::Tensor> buffers,
                           std::vector<ShardRange> plan, c10::intrusive_ptr<c10d::ProcessGroup> group,
                           int64_t bucket_bytes)
    : params_(std::move(params)),
      buffers_(std::move(buffers)),
      plan_(std::move(plan)),
      group_(std::move(group)),
      rank_(group_->getRank()) {
  HETSEQ_ASSERT(!params_.empty() && static_cast<int64_t>(plan_.size()) == group_->getSize(),
                "ShardReducer with {} parameters and a plan of {} ranks for {}", params_.size(), plan_.size(),
                group_->getSize());
  int64_t total = 0;
  for (const auto& p : params_) {
    param_first_.push_back(total);
    total += p.numel();
  }
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(params_.front().element_size()));
  buckets_ = cut_buckets(plan_, cap);
  bucket_params_.resize(buckets_.size());
  param_buckets_.resize(params_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const int64_t lo = buckets_[b].first, hi = lo + buckets_[b].numel;
    // The parameters whose elements meet [lo, hi): from the last that starts before hi, down.
    auto it = std::upper_bound(param_first_.begin(), param_first_.end(), hi - 1);
    for (auto p = static_cast<size_t>(it - param_first_.begin()); p-- > 0;) {
      if (param_first_[p] + params_[p].numel() <= lo) break;
      if (params_[p].numel() == 0) continue;
      bucket_params_[b].push_back(p);
      param_buckets_[p].push_back(b);
    }
  }
  const ShardRange mine = plan_[static_cast<size_t>(rank_)];
  shard_gradient_ = torch::zeros({mine.numel}, params_.front().options().requires_grad(false));
  for (size_t p = 0; p < params_.size(); ++p) {
    hooks_.add(params_[p], [this, p] { on_gradient(p); }, fmt::format("parameter {}", p));
  }
}

ShardReducer::~ShardReducer() {
  for (auto& f : in_flight_) {
    try {
      f.work->wait();
    } catch (...) {  // an update that failed: its error has been reported
    }
  }
}

std::vector<torch::Tensor> ShardReducer::shard_gradient_views(const std::vector<ShardSlice>& slices) const {
  const int64_t first = plan_[static_cast<size_t>(rank_)].first;
  std::vector<torch::Tensor> views;
  for (const ShardSlice& s : slices) {
    views.push_back(shard_gradient_.narrow(0, param_first_[s.param] + s.offset - first, s.numel));
  }
  return views;
}

void ShardReducer::before_forward() {
  if (buffers_.empty()) return;  // the same model, so the same choice on every rank
  broadcast_model_buffers(group_, buffers_, rank_, group_->getSize());
}

void ShardReducer::before_backward(int64_t index, int64_t count, const torch::Tensor&, const SampleCount&) {
  armed_ = index == count - 1;
  if (!armed_) return;
  waiting_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = static_cast<int64_t>(bucket_params_[b].size());
  param_left_.assign(params_.size(), 0);
  for (size_t p = 0; p < params_.size(); ++p) param_left_[p] = static_cast<int64_t>(param_buckets_[p].size());
  next_launch_ = 0;
  timing_ = ReductionTiming{};
}

void ShardReducer::on_gradient(size_t param) {
  if (!armed_) return;
  for (size_t b : param_buckets_[param]) --waiting_[b];
  launch_ready();
}

void ShardReducer::launch_ready() {
  while (next_launch_ < buckets_.size() && waiting_[next_launch_] <= 0) launch(next_launch_++);
}

void ShardReducer::launch(size_t b) {
  torch::NoGradGuard no_grad;
  const Bucket& bucket = buckets_[b];
  const bool mine = bucket.owner == rank_;
  torch::Tensor buffer = torch::empty({bucket.numel}, shard_gradient_.options());
  for (size_t p : bucket_params_[b]) {
    const int64_t lo = std::max(bucket.first, param_first_[p]);
    const int64_t hi = std::min(bucket.first + bucket.numel, param_first_[p] + params_[p].numel());
    torch::Tensor dst = buffer.narrow(0, lo - bucket.first, hi - lo);
    const torch::Tensor& g = params_[p].grad();
    if (g.defined()) {
      dst.copy_(g.reshape({-1}).narrow(0, lo - param_first_[p], hi - lo));
    } else {
      dst.zero_();
    }
    if (--param_left_[p] == 0) params_[p].mutable_grad().reset();
  }
  while (in_flight_.size() >= 2) {
    finish(in_flight_.front());
    in_flight_.pop_front();
  }
  InFlight f;
  f.input = {buffer};
  if (mine) {
    f.output.resize(1);
    for (int64_t r = 0; r < group_->getSize(); ++r) {
      f.output[0].push_back(r == rank_ ? buffer : torch::empty({bucket.numel}, buffer.options()));
    }
  }
  c10d::GatherOptions options;
  options.rootRank = bucket.owner;
  f.work = group_->gather(f.output, f.input, options);
  f.bucket = b;
  in_flight_.push_back(std::move(f));
  ++timing_.buckets;
  timing_.bytes += static_cast<int64_t>(buffer.nbytes());
}

void ShardReducer::finish(InFlight& f) {
  const Bucket& bucket = buckets_[f.bucket];
  wait_for_peers(f.work, rank_, group_->getSize(),
                 fmt::format("gather of gradient bucket {} to rank {}", f.bucket, bucket.owner));
  if (bucket.owner == rank_) {
    torch::NoGradGuard no_grad;
    const std::vector<torch::Tensor>& copies = f.output[0];  // [rank]
    torch::Tensor dst = shard_gradient_.narrow(0, bucket.first - plan_[static_cast<size_t>(rank_)].first,
                                               bucket.numel);
    if (copies.size() == 1) {
      dst.copy_(copies[0]);
    } else {
      // Rank order, as the shared-memory reduction adds (Note [Sharded gradients]).
      at::add_out(dst, copies[0], copies[1]);
      for (size_t r = 2; r < copies.size(); ++r) dst.add_(copies[r]);
    }
  }
  f.input.clear();
  f.output.clear();
}

void ShardReducer::finish_update() {
  if (!armed_) before_backward(0, 1, torch::Tensor(), nullptr);  // no backward ran: every bucket as zeros
  const auto start = std::chrono::steady_clock::now();
  while (next_launch_ < buckets_.size()) launch(next_launch_++);
  while (!in_flight_.empty()) {
    finish(in_flight_.front());
    in_flight_.pop_front();
  }
  for (auto& p : params_) p.mutable_grad().reset();
  armed_ = false;
  timing_.exposed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  timing_.comm_s = timing_.exposed_s;
}

}  // namespace hetseq
