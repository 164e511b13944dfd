#include "hetseq/distributed/powersgd.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {

// Note [PowerSGD]
// ~~~~~~~~~~~~~~~
// What is sent. A gradient view of the bucket with dim >= 2 is read as a matrix M of n x m
// (n = shape[0], m = numel / n, in the view's logical order). It is compressed when the rank-r
// approximation saves at least min_compression_rate: (n + m) * r * rate <= n * m (r = --powersgd-rank;
// the factors use r' = min(r, n, m) columns, as more than that spans nothing new). Every other view
// (vectors, small matrices) is summed exactly. Per update and bucket, with W ranks and S = sum_r M_r:
//   1. M_r += e_r (this rank's error feedback, below); P_r = M_r Q for every compressed matrix, with
//      Q (m x r') the same on every rank;
//   2. allreduce(SUM) of one flat tensor: every P_r, then the uncompressed views; P = sum_r P_r = S Q;
//   3. P := an orthonormal basis of its columns (Gram-Schmidt, see orthonormalize below);
//   4. Q_r = M_r^T P; e_r = M_r - P Q_r^T, computed before step 5 overwrites M_r;
//   5. allreduce(SUM) of one flat tensor of every Q_r: Q = S^T P;
//   6. the bucket's view becomes P Q^T = P P^T S, the projection of the sum on P's columns; Q is kept
//      for the next update (warm start: one power-iteration step per update, continued).
// It is a SUM, as the plain comm hook's (see Note [Weighted averaging]): nothing is divided by W. Both
// allreduces carry (n + m) r' floats per compressed matrix instead of n m.
//
// Error feedback. The sum over ranks of e_r = M_r - P Q_r^T is S - P P^T S, the part of the sum the
// approximation left out, and it is added back in the next update, so that the running sum of the
// results follows the running sum of the exact sums (their difference is the current total error, which
// stays bounded instead of growing with every update). This is the error of Vogels et al. (2019,
// Algorithm 2): the residual of this rank's own matrix off the shared P. The simpler M_r - (P Q^T)/W
// has the same sum over ranks, but each rank's share also holds M_r minus the mean over the ranks; with
// heterogeneous ranks (unequal batches, so systematically unequal gradients) that share grows by
// g_r - mean(g) every update, without bound, and the errors lose precision. For the same reason the
// uncompressed views have no error: their sum is exact.
//
// Q. The first Q of every matrix is drawn from a generator seeded from (seed, bucket, index of the view
// in the bucket), the global RNG untouched, and orthonormalised, so every rank starts from the same Q.
// A bucket's state (Q, errors) is rebuilt from scratch whenever its views' shapes change (the reducer
// rebuilds its buckets once, after the first update). A column of the kept Q that came out non-finite
// or zero (a zero or non-finite gradient) is replaced by its initial column, or it would stay so.
//
// Overflow (fp16 loss scaling). A non-finite value of M_r on any rank makes its rows of P_r, and so the
// summed P and the whole approximation of that matrix, non-finite on every rank; a non-finite
// uncompressed view makes its exact sum non-finite on every rank. So every rank sees the overflow and
// skips the update. Then the errors of the bucket are reset to zero (they would carry inf/NaN into every
// later update) and Q's non-finite columns are reinitialised as above. Both are decided on the device
// from the summed tensors (identical on every rank), without a host synchronisation.
//
// Warm-up. For updates before start_update the bucket is a plain SUM allreduce; errors and Q are not
// touched.
//
// Order of collectives. Gloo pairs the collectives of a group by the order in which each rank issued
// them. Step 5 starts in the completion callback of step 2 (a backend thread, never blocking the
// caller), while the caller goes on starting later buckets: issued as they come, the order would differ
// between ranks. So every collective of a PowerSgd takes a ticket when reduce() is called (in bucket
// order, the same on every rank; two per compressed bucket, one per plain one) and is issued only after
// the collective of the previous ticket (CollectiveSequence below): P(b0), Q(b0), P(b1), Q(b1), ...
// A launch whose turn has not come is left to the thread that issues its predecessor. The group must
// not carry other collectives while a reduction is in flight.

// Note [PowerSGD in checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What a resumed run needs to continue PowerSGD as if it had not stopped: the update count (or the
// warm-up of start_update would run again), and per bucket the Q of the last update and every rank's
// error e_r. The initial Q's are not kept: they are drawn from (seed, bucket, view), so the resumed
// run draws them again, and PowerSGD has no other random state. Q is the result of an allreduce, the
// same on every rank, and is saved once (rank 0's); the errors differ per rank, and since only rank 0
// writes the checkpoint, gather_state gathers them there: one gather per save, of the compressed
// matrices' size per rank, while the other ranks wait for rank 0's write anyway. The checkpoint holds
// them as [rank] x n x m per matrix, with the bucket's gradient shapes to check them against.
//
// What a resume that changes the split or the world keeps. Every step of Note [PowerSGD] sees the
// ranks' matrices M_r = g_r + e_r only through their sum S = sum_r M_r (P = S Q and Q = S^T P are
// sums; the orthonormalisation acts on the summed P), and the error carried into the next update, in
// total, is sum_r e_r = S - P P^T S. So what must survive a resume is the total error; how it is
// spread over the ranks changes only the rounding.
//  * The same world size: rank r takes back its own e_r. With the same split the resumed run is the
//    uninterrupted one bit for bit. With another split (other --max-sentences or --update-freq, a
//    balanced split) the g_r are cut differently, and the total error is still carried exactly: no
//    part of a past gradient is lost or sent twice.
//  * Another world size: the new rank r has no old rank of its own. Rank 0 takes the sum of the saved
//    ranks' errors (summed in float64, rounded once), the other ranks start from zero: the total is
//    kept. A resumed run's next result then equals, up to rounding, what the saved world would have
//    sent for the same total gradient.
//  * A bucket whose gradients have other shapes than those saved (another bucket layout, the saved
//    one refused), or whose matrices would be compressed otherwise (another --powersgd-rank), starts
//    afresh: zero error, initial Q, and a logged line naming the bucket and why. What it drops is one
//    update's residual, which error feedback keeps bounded (Note [PowerSGD]), not a growing quantity.
// A checkpoint without PowerSGD state (written without --ddp-comm-hook powersgd, or by an earlier
// hetseq) starts PowerSGD afresh, warm-up included; the reducer logs it.

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

}  // namespace detail

namespace {

using detail::CollectiveSequence;
using detail::PowerSgdBucket;
using detail::PowerSgdMatrix;

const char* const kPeerHint =
    "(a peer died, fell behind past the process group's timeout, or ran a different number of backward passes)";

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Makes the columns of `p` (n x r, r <= n) orthonormal, in place: Gram-Schmidt, each column projected
// off the previous ones twice ("twice is enough": once loses orthogonality when a column is nearly in
// the span of the others). A zero column stays zero; a non-finite one stays non-finite (no host sync).
void orthonormalize(at::Tensor& p) {
  const int64_t r = p.size(1);
  const double tiny = p.scalar_type() == at::kDouble ? 1e-300 : 1e-30;
  for (int64_t j = 0; j < r; ++j) {
    at::Tensor col = p.select(1, j);
    for (int pass = 0; pass < (j > 0 ? 2 : 0); ++pass) {
      for (int64_t k = 0; k < j; ++k) {
        at::Tensor done = p.select(1, k);
        col.sub_(done * at::dot(done, col));
      }
    }
    col.div_(col.norm().clamp_min(tiny));
  }
}

// Everything one reduce() of a compressed bucket needs in its callbacks.
struct Reduction {
  explicit Reduction(c10::weak_intrusive_ptr<c10d::ProcessGroup> weak_group) : group(std::move(weak_group)) {}

  std::shared_ptr<PowerSgdBucket> state;
  std::shared_ptr<CollectiveSequence> sequence;
  c10::weak_intrusive_ptr<c10d::ProcessGroup> group;  // weak: see start_allreduce
  c10::intrusive_ptr<c10::ivalue::Future> result;
  at::Tensor buffer;
  std::vector<at::Tensor> grads;   // [view] views into buffer
  std::vector<at::Tensor> matrix;  // [compressed view] n x m, gradient plus error
  std::vector<bool> in_place;      // [compressed view] matrix is a view of the buffer
  at::Tensor first;                // the P's, then the uncompressed views
  at::Tensor second;               // the Q's
  std::vector<at::Tensor> p, q;    // [compressed view] n x rank and m x rank views of first and second
  int64_t ticket = 0;              // of the first allreduce; the second has ticket + 1
  int64_t bucket = 0;
  int rank = 0, size = 1;

  int64_t bytes(const at::Tensor& t) const { return t.numel() * static_cast<int64_t>(t.element_size()); }
};

// Starts an allreduce(SUM) of `tensor` on `group` and returns its future. The callbacks hold the group
// weakly, and the strong reference is dropped before any callback can complete a result: the owner may
// let go of the group as soon as every result is complete, and the last reference must not be dropped on
// one of the group's own threads (its destructor joins them).
c10::intrusive_ptr<c10::ivalue::Future> start_allreduce(const c10::weak_intrusive_ptr<c10d::ProcessGroup>& weak,
                                                        const at::Tensor& tensor, int64_t bucket) {
  c10::intrusive_ptr<c10d::ProcessGroup> group = weak.lock();
  HETSEQ_ASSERT(group, "PowerSgd: the process group was closed while gradient bucket {} was being reduced", bucket);
  std::vector<at::Tensor> tensors{tensor};
  return group->allreduce(tensors)->getFuture();
}

void fail(Reduction& r, std::exception_ptr error) {
  if (!r.result->completed()) r.result->setError(std::move(error));
}

// Step 6 of Note [PowerSGD], once the Q's are summed.
void finish(const std::shared_ptr<Reduction>& r, c10::ivalue::Future& done) {
  try {
    if (done.hasError()) {
      throw PeerError(fmt::format(
          "rank {} of {}: the PowerSGD allreduce of Q of gradient bucket {} ({} bytes) failed: {} {}", r->rank,
          r->size, r->bucket, r->bytes(r->second), done.tryRetrieveErrorMessage(), kPeerHint));
    }
    auto& matrices = r->state->matrices;
    for (size_t k = 0; k < matrices.size(); ++k) {
      const at::Tensor& grad = r->grads[static_cast<size_t>(matrices[k].index)];
      if (r->in_place[k]) {
        at::mm_out(r->matrix[k], r->p[k], r->q[k].t());
      } else {
        grad.copy_(at::mm(r->p[k], r->q[k].t()).view(grad.sizes()));
      }
    }
    // See "Overflow" in Note [PowerSGD]: decided from the summed tensors, the same on every rank.
    const at::Tensor overflow =
        at::logical_not(at::isfinite(r->first).all()) | at::logical_not(at::isfinite(r->second).all());
    for (size_t k = 0; k < matrices.size(); ++k) {
      PowerSgdMatrix& mat = matrices[k];
      const at::Tensor usable = at::isfinite(r->q[k]).all(0) & (r->q[k].abs().amax(0) > 0);  // [column]
      mat.q.copy_(at::where(usable, r->q[k], mat.q0));
      mat.error.masked_fill_(overflow, 0);
    }
    r->result->markCompleted(c10::IValue(std::vector<at::Tensor>{r->buffer}));
  } catch (...) {
    fail(*r, std::current_exception());
  }
}

void launch_second(const std::shared_ptr<Reduction>& r) {
  try {
    auto future = start_allreduce(r->group, r->second, r->bucket);
    future->addCallback([r](c10::ivalue::Future& done) { finish(r, done); });
  } catch (...) {
    fail(*r, std::current_exception());
  }
}

// Steps 3 to 5 of Note [PowerSGD], once the P's and the uncompressed views are summed.
void after_first(const std::shared_ptr<Reduction>& r, c10::ivalue::Future& done) {
  try {
    if (done.hasError()) {
      throw PeerError(fmt::format(
          "rank {} of {}: the PowerSGD allreduce of P and the uncompressed gradients of gradient bucket {} ({} bytes) "
          "failed: {} {}",
          r->rank, r->size, r->bucket, r->bytes(r->first), done.tryRetrieveErrorMessage(), kPeerHint));
    }
    PowerSgdBucket& state = *r->state;
    int64_t offset = state.p_numel;
    for (int64_t index : state.plain) {
      const at::Tensor& grad = r->grads[static_cast<size_t>(index)];
      grad.copy_(r->first.narrow(0, offset, grad.numel()).view(grad.sizes()));
      offset += grad.numel();
    }
    for (size_t k = 0; k < state.matrices.size(); ++k) {
      PowerSgdMatrix& mat = state.matrices[k];
      orthonormalize(r->p[k]);
      at::mm_out(r->q[k], r->matrix[k].t(), r->p[k]);
      // e_r = M_r - P Q_r^T, before the allreduce sums the Q's and finish() overwrites M_r.
      at::addmm_out(mat.error, r->matrix[k], r->p[k], r->q[k].t(), /*beta=*/1, /*alpha=*/-1);
    }
  } catch (...) {
    fail(*r, std::current_exception());
    r->sequence->submit(r->ticket + 1, [] {});  // later buckets must not wait for this one's second turn
    return;
  }
  r->sequence->submit(r->ticket + 1, [r] { launch_second(r); });
}

void launch_first(const std::shared_ptr<Reduction>& r) {
  try {
    auto future = start_allreduce(r->group, r->first, r->bucket);
    future->addCallback([r](c10::ivalue::Future& done) { after_first(r, done); });
  } catch (...) {
    fail(*r, std::current_exception());
    r->sequence->submit(r->ticket + 1, [] {});
  }
}

bool same_shapes(const PowerSgdBucket& state, const std::vector<at::Tensor>& grads) {
  if (state.shapes.size() != grads.size()) return false;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].sizes().equals(state.shapes[i])) return false;
  }
  return true;
}

}  // namespace

namespace detail {

at::Tensor powersgd_initial_q(uint64_t seed, int64_t bucket, int64_t index, int64_t m, int64_t rank) {
  const uint64_t mixed = splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(bucket)) ^
                                    static_cast<uint64_t>(index));
  at::Generator generator = at::detail::createCPUGenerator(mixed);
  at::Tensor q = at::randn({m, rank}, generator, at::TensorOptions().dtype(at::kFloat));
  orthonormalize(q);
  return q;
}

}  // namespace detail

PowerSgd::PowerSgd(c10::intrusive_ptr<c10d::ProcessGroup> group, PowerSgdOptions options)
    : group_(std::move(group)), options_(options), sequence_(std::make_shared<detail::CollectiveSequence>()) {
  HETSEQ_ASSERT(group_, "PowerSgd built without a process group");
  HETSEQ_ASSERT(options_.rank >= 1, "PowerSgd built with unchecked options (PowerSgdOptions::validate)");
}

PowerSgd::~PowerSgd() = default;

void PowerSgd::begin_update() { ++update_; }

std::shared_ptr<detail::PowerSgdBucket> PowerSgd::bucket_state(int64_t bucket, const at::Tensor& buffer,
                                                               const std::vector<at::Tensor>& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = buckets_[bucket];
  const at::ScalarType work = buffer.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (slot && same_shapes(*slot, grads) && slot->work_dtype == work && slot->device == buffer.device()) return slot;

  auto state = std::make_shared<detail::PowerSgdBucket>();
  state->work_dtype = work;
  state->device = buffer.device();
  const auto options = buffer.options().dtype(work);
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& grad = grads[i];
    state->shapes.push_back(grad.sizes().vec());
    const int64_t numel = grad.numel();
    const int64_t n = grad.dim() >= 2 ? grad.size(0) : 0;
    const int64_t m = n > 0 ? numel / n : 0;
    const double dense = static_cast<double>(n) * static_cast<double>(m);
    const double factors = static_cast<double>(n + m) * static_cast<double>(options_.rank);
    const bool compress = numel > 0 && n > 0 && factors * options_.min_compression_rate <= dense;
    if (!compress) {
      state->plain.push_back(static_cast<int64_t>(i));
      state->plain_numel += numel;
      continue;
    }
    detail::PowerSgdMatrix mat;
    mat.index = static_cast<int64_t>(i);
    mat.n = n;
    mat.m = m;
    mat.rank = std::min({options_.rank, n, m});
    mat.q0 = detail::powersgd_initial_q(options_.seed, bucket, mat.index, m, mat.rank).to(options);
    mat.q = mat.q0.clone();
    mat.error = at::zeros({n, m}, options);
    state->p_numel += n * mat.rank;
    state->q_numel += m * mat.rank;
    state->matrices.push_back(std::move(mat));
  }
  if (auto saved = restored_.find(bucket); saved != restored_.end()) {
    if (const std::string why = restore_bucket(*state, saved->second); !why.empty()) {
      log::warn("[powersgd] rank {}: gradient bucket {} of {} does not fit this run ({}): its error feedback and Q "
                "start afresh (see Note [PowerSGD in checkpoints])",
                group_->getRank(), bucket, restored_from_, why);
    }
    restored_.erase(saved);
  }
  slot = state;
  return state;
}

std::string PowerSgd::restore_bucket(detail::PowerSgdBucket& state, const PowerSgdState::Bucket& saved) const {
  if (saved.shapes != state.shapes) return "its gradients have other shapes than when it was saved";
  std::vector<int64_t> compressed;
  for (const auto& mat : state.matrices) compressed.push_back(mat.index);
  if (saved.matrices != compressed) {
    return fmt::format("views [{}] were compressed, now [{}] are; was --powersgd-rank changed?",
                       fmt::join(saved.matrices, ","), fmt::join(compressed, ","));
  }
  if (saved.errors.size() != state.matrices.size()) return "the checkpoint holds no error feedback for it";
  for (size_t k = 0; k < state.matrices.size(); ++k) {
    const auto& mat = state.matrices[k];
    if (!saved.q[k].sizes().equals({mat.m, mat.rank})) {
      return fmt::format("the Q of view {} is [{}], now [{}, {}]; was --powersgd-rank changed?", mat.index,
                         fmt::join(saved.q[k].sizes(), ", "), mat.m, mat.rank);
    }
    if (!saved.errors[k].sizes().equals({restored_world_, mat.n, mat.m})) {
      return fmt::format("the error feedback of view {} is [{}], not [{}, {}, {}]", mat.index,
                         fmt::join(saved.errors[k].sizes(), ", "), restored_world_, mat.n, mat.m);
    }
  }
  const auto rank = group_->getRank();
  const bool same_world = restored_world_ == group_->getSize();
  const auto options = at::TensorOptions().dtype(state.work_dtype).device(state.device);
  for (size_t k = 0; k < state.matrices.size(); ++k) {
    auto& mat = state.matrices[k];
    mat.q = saved.q[k].to(options, /*non_blocking=*/false, /*copy=*/true);
    if (same_world) {
      mat.error = saved.errors[k][rank].to(options, false, true);
    } else if (rank == 0) {
      mat.error = saved.errors[k].to(at::kDouble).sum(0).to(options);
    }  // else: zero, as built
  }
  return {};
}

PowerSgdState PowerSgd::gather_state() {
  PowerSgdState out;
  out.update = update_;
  out.world_size = group_->getSize();
  std::vector<std::pair<int64_t, std::shared_ptr<detail::PowerSgdBucket>>> buckets;  // [bucket] by index
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [index, state] : buckets_) {
      if (state && !state->matrices.empty()) buckets.emplace_back(index, state);
    }
  }
  std::sort(buckets.begin(), buckets.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // This rank's errors, flat, in bucket and matrix order; in float64 where the buckets' dtypes differ.
  std::vector<at::Tensor> mine;
  at::ScalarType dtype = buckets.empty() ? at::kFloat : buckets.front().second->work_dtype;
  for (const auto& [index, state] : buckets) {
    PowerSgdState::Bucket saved;
    saved.index = index;
    saved.shapes = state->shapes;
    for (const auto& mat : state->matrices) {
      saved.matrices.push_back(mat.index);
      saved.q.push_back(cpu_copy(mat.q));
      mine.push_back(mat.error.reshape(-1));
      if (mat.error.scalar_type() != dtype) dtype = at::kDouble;
    }
    out.buckets.push_back(std::move(saved));
  }
  if (mine.empty()) return out;  // warm-up: nothing compressed yet, on every rank alike
  for (auto& t : mine) t = t.to(dtype);
  std::vector<at::Tensor> input{at::cat(mine)};
  const auto rank = group_->getRank();
  const auto size = group_->getSize();
  std::vector<std::vector<at::Tensor>> gathered;  // [0][rank] on rank 0; empty elsewhere (c10d's gather)
  if (rank == 0) {
    gathered.emplace_back();
    for (int r = 0; r < size; ++r) gathered.back().push_back(at::empty_like(input[0]));
  }
  c10d::GatherOptions options;
  options.rootRank = 0;
  try {
    group_->gather(gathered, input, options)->wait();
  } catch (const std::exception& e) {
    throw PeerError(fmt::format("rank {} of {}: gathering the PowerSGD error feedback ({} bytes) to rank 0 for a "
                                "checkpoint failed: {} {}",
                                rank, size, input[0].numel() * static_cast<int64_t>(input[0].element_size()),
                                e.what(), kPeerHint));
  }
  if (rank != 0) return out;
  // Rank 0 holds the gathered errors once more, laid out per matrix as the checkpoint keeps them.
  for (size_t b = 0; b < buckets.size(); ++b) {
    for (const auto& mat : buckets[b].second->matrices) {
      out.buckets[b].errors.push_back(
          at::empty({size, mat.n, mat.m}, at::TensorOptions().dtype(buckets[b].second->work_dtype)));
    }
  }
  for (int r = 0; r < size; ++r) {
    const at::Tensor flat = gathered[0][static_cast<size_t>(r)].to(at::kCPU);
    int64_t offset = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      for (size_t k = 0; k < out.buckets[b].errors.size(); ++k) {
        at::Tensor slot = out.buckets[b].errors[k][r];
        slot.copy_(flat.narrow(0, offset, slot.numel()).view(slot.sizes()));
        offset += slot.numel();
      }
    }
    gathered[0][static_cast<size_t>(r)] = at::Tensor();  // its memory goes as soon as it is copied
  }
  return out;
}

void PowerSgd::load_state(PowerSgdState state, const std::string& source) {
  HETSEQ_ASSERT(update_ == -1, "PowerSgd::load_state after {} updates; it restores a fresh PowerSgd only", update_ + 1);
  std::lock_guard<std::mutex> lock(mutex_);
  update_ = state.update;
  restored_world_ = state.world_size;
  restored_from_ = source;
  restored_.clear();
  for (auto& bucket : state.buckets) restored_[bucket.index] = std::move(bucket);
  const auto size = group_->getSize();
  log::info("[powersgd] {}: continuing after update {} with the Q and error feedback of {} gradient bucket(s){}",
            source, state.update + 1, restored_.size(),
            restored_.empty() || state.world_size == size
                ? std::string()
                : fmt::format("; the errors were saved by {} ranks and this run has {}: rank 0 takes their sum, the "
                              "others start from zero (see Note [PowerSGD in checkpoints])",
                              state.world_size, size));
}

c10::intrusive_ptr<c10::ivalue::Future> PowerSgd::reduce(int64_t bucket, at::Tensor buffer,
                                                         const std::vector<at::Tensor>& grads) {
  HETSEQ_ASSERT(update_ >= 0, "PowerSgd::reduce of bucket {} before the first begin_update", bucket);
  HETSEQ_ASSERT(buffer.defined() && buffer.is_floating_point(), "PowerSgd: bucket {} is not a floating-point buffer",
                bucket);
  std::vector<c10::Device> devices;
  if (!buffer.is_cpu()) devices.push_back(buffer.device());
  auto result = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(), devices);
  const int rank = static_cast<int>(group_->getRank());
  const int size = static_cast<int>(group_->getSize());

  std::shared_ptr<detail::PowerSgdBucket> state;
  if (update_ >= options_.start_update) {
    for (const auto& grad : grads) {
      HETSEQ_ASSERT(grad.defined() && grad.device() == buffer.device(),
                    "PowerSgd: a gradient of bucket {} is undefined or not on the buffer's device", bucket);
    }
    state = bucket_state(bucket, buffer, grads);
  }

  if (!state || state->matrices.empty()) {  // warm-up, or nothing worth compressing: a plain SUM
    const int64_t ticket = sequence_->reserve(1);
    sequence_->submit(ticket, [group = c10::weak_intrusive_ptr<c10d::ProcessGroup>(group_), result, buffer, bucket,
                               rank, size] {
      try {
        auto future = start_allreduce(group, buffer, bucket);
        future->addCallback([result, buffer, bucket, rank, size](c10::ivalue::Future& done) {
          if (done.hasError()) {
            result->setError(std::make_exception_ptr(PeerError(fmt::format(
                "rank {} of {}: the allreduce of gradient bucket {} ({} bytes) failed: {} {}", rank, size, bucket,
                buffer.numel() * static_cast<int64_t>(buffer.element_size()), done.tryRetrieveErrorMessage(),
                kPeerHint))));
            return;
          }
          result->markCompleted(c10::IValue(std::vector<at::Tensor>{buffer}));
        });
      } catch (...) {
        result->setError(std::current_exception());
      }
    });
    return result;
  }

  // Step 1 of Note [PowerSGD], in the calling thread.
  auto r = std::make_shared<Reduction>(c10::weak_intrusive_ptr<c10d::ProcessGroup>(group_));
  r->state = state;
  r->sequence = sequence_;
  r->result = result;
  r->buffer = buffer;
  r->grads = grads;
  r->bucket = bucket;
  r->rank = rank;
  r->size = size;
  const auto options = buffer.options().dtype(state->work_dtype);
  r->first = at::empty({state->p_numel + state->plain_numel}, options);
  r->second = at::empty({state->q_numel}, options);
  int64_t p_offset = 0, q_offset = 0;
  for (const detail::PowerSgdMatrix& mat : state->matrices) {
    const at::Tensor& grad = grads[static_cast<size_t>(mat.index)];
    const bool in_place = grad.scalar_type() == state->work_dtype && grad.is_contiguous();
    at::Tensor matrix = in_place ? grad.view({mat.n, mat.m}) : grad.reshape({mat.n, mat.m}).to(options, false, true);
    matrix.add_(mat.error);
    r->p.push_back(r->first.narrow(0, p_offset, mat.n * mat.rank).view({mat.n, mat.rank}));
    r->q.push_back(r->second.narrow(0, q_offset, mat.m * mat.rank).view({mat.m, mat.rank}));
    at::mm_out(r->p.back(), matrix, mat.q);
    r->matrix.push_back(std::move(matrix));
    r->in_place.push_back(in_place);
    p_offset += mat.n * mat.rank;
    q_offset += mat.m * mat.rank;
  }
  for (int64_t index : state->plain) {
    const at::Tensor& grad = grads[static_cast<size_t>(index)];
    r->first.narrow(0, p_offset, grad.numel()).view(grad.sizes()).copy_(grad);
    p_offset += grad.numel();
  }
  r->ticket = sequence_->reserve(2);
  sequence_->submit(r->ticket, [r] { launch_first(r); });
  return result;
}

}  // namespace hetseq
