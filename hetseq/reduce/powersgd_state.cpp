#include "hetseq/reduce/powersgd.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/reduce/powersgd_bucket.h"

namespace hetseq {

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
                                e.what(), detail::kPowerSgdPeerHint));
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

}  // namespace hetseq
