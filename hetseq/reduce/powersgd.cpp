#include "hetseq/reduce/powersgd.h"
#include "hetseq/reduce/powersgd_bucket.h"

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
// the collective of the previous ticket (CollectiveSequence, powersgd_bucket.h): P(b0), Q(b0), P(b1), Q(b1), ...
// A launch whose turn has not come is left to the thread that issues its predecessor. The group must
// not carry other collectives while a reduction is in flight.

// Checkpoints keep PowerSGD's state: Note [PowerSGD in checkpoints] (powersgd_state.cpp).

namespace {

using detail::CollectiveSequence;
using detail::PowerSgdBucket;
using detail::PowerSgdMatrix;

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
          r->size, r->bucket, r->bytes(r->second), done.tryRetrieveErrorMessage(), detail::kPowerSgdPeerHint));
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
          r->rank, r->size, r->bucket, r->bytes(r->first), done.tryRetrieveErrorMessage(), detail::kPowerSgdPeerHint));
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
                detail::kPowerSgdPeerHint))));
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
