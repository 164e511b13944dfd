#include "hetseq/train/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {
namespace {

bool power_of_two(double x) {
  int exponent = 0;
  return x > 0 && std::isfinite(x) && std::frexp(x, &exponent) == 0.5;
}

}  // namespace

// Note [Loss scaling]
// ~~~~~~~~~~~~~~~~~~~
// Under --fp16 the forward pass runs in float16 (autocast), and so do the backward passes of its
// float16 operations. Float16 ends at 65504 and loses precision below 6e-5 (denormals from 6e-8),
// where many activation gradients of a deep network lie: they would flush to zero. The Controller
// therefore differentiates S * L instead of L, where L is the summed loss of a micro-batch (in float32)
// and S the loss scale, so that backward works on gradients S times larger. The parameters, their
// gradients and the optimizer stay float32.
//
// Exactness. S is always a power of two. Multiplying by a power of two only changes the exponent, so
// in float32 arithmetic (barring overflow and denormals) every rounding of the backward pass happens
// at the same place as without the scale: the gradient of S * L is exactly S times the gradient of L.
// (In float16 the scale does change which small values flush to zero; that is its purpose.) The
// reducer sums the ranks' scaled gradients, and the Controller divides the sum by S * N, N the total
// sample size of the update: one division, whose divisor is exact in float32 while N < 2^24. The
// result is the gradient of the global mean loss of Note [Weighted averaging], rounded exactly as
// without scaling: heterogeneity weighting and loss scaling commute bit for bit. A test trains in
// float32 with and without a moving scale and requires equal, not close, parameters.
//
// Overflow and agreement. When S is too large some float16 value overflows, and inf or NaN reaches
// the float32 gradients. The Controller looks for it after the reduction, in the gradient norm it
// computes anyway (float64). Inf and NaN survive the sum over ranks, and an allreduce leaves bitwise
// the same sum on every rank, so every rank sees the same overflow, skips the same update (no
// optimizer step, no update count, no meters), and feeds its DynamicLossScaler the same decision:
// the scalers of all ranks move in lockstep without a message of their own. Checkpoints carry the
// scaler's state with the optimizer's, and the start and resume handshakes compare it.
//
// The schedule follows HetSeq's (fairseq's) dynamic scaler: after an overflow the scale halves (not
// below --threshold-loss-scale), unless overflows make up less than --fp16-scale-tolerance of the
// updates since the scale last moved; after --fp16-scale-window updates in a row without overflow it
// doubles. A scale driven below --min-loss-scale means the loss itself is inf or NaN: training stops
// with an error rather than skipping updates forever.

// Note [Loss scale window on resume]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint keeps the scale and every counter of the schedule (updates without overflow since the
// last overflow or growth, updates and overflows since the scale last moved, overflows in all) and the
// window they count toward. Restored as saved, a resume continues the schedule exactly, mid-window
// included: the scale moves at the same updates as in the run that did not stop.
//
// A resume that changes the split. The scale, the overflow counters and the tolerance share
// (overflowing updates per update since the last move) do not depend on how an update's samples are
// cut among the ranks: every rank feeds the scaler the same decision per update whatever the split
// (Note [Loss scaling]). They are kept as saved.
//
// The window is another matter. Its default is HetSeq's, 2^14 micro-batches over all ranks
// (MixedPrecisionOptions::default_scale_window): 16384 / M updates, M the ranks' micro-batches per
// update, so another --update-freq or world size gives another window W in updates, while other batch
// sizes or a balanced split keep it. The count c of updates without overflow is progress toward the
// window, in the window's unit; a resume under a window W' != W carries it as the same share:
//     c' = floor(c * W' / W).
// Under the default window this keeps the micro-batches run without overflow (c * M = c' * M', up to
// the rounding down), so the scale grows after as many clean micro-batches as it would have without the
// stop. The alternatives are worse: keeping c in updates doubles the scale on the first update when
// the window shrank below c, before the new split has run a single clean micro-batch more; resetting c
// to 0 delays the growth by up to a whole window, and in a run that is resumed often, prevents it.
// Rounding down errs toward the safe side: the scale grows one update later at most. The same rule
// serves an explicit --fp16-scale-window changed on resume. A state without a window (an earlier
// hetseq) is taken as counted under this run's window, which is what that hetseq did, and logged.

void LossScalerOptions::validate() const {
  if (!power_of_two(init_scale)) {
    throw UsageError(fmt::format("--fp16-init-scale: {} is not a power of two (loss scales are powers of two so "
                                 "that unscaling is exact); try 128",
                                 init_scale));
  }
  if (scale_window <= 0) throw UsageError(fmt::format("--fp16-scale-window: {} must be a positive integer", scale_window));
  if (!(tolerance >= 0 && tolerance <= 1)) {
    throw UsageError(fmt::format("--fp16-scale-tolerance: {} must be between 0 and 1", tolerance));
  }
  if (!(min_scale > 0) || !std::isfinite(min_scale)) {
    throw UsageError(fmt::format("--min-loss-scale: {} must be positive", min_scale));
  }
  if (min_scale > init_scale) {
    throw UsageError(fmt::format("--min-loss-scale: {} is above --fp16-init-scale {}", min_scale, init_scale));
  }
  if (threshold && !power_of_two(*threshold)) {
    throw UsageError(fmt::format("--threshold-loss-scale: {} is not a power of two", *threshold));
  }
}

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options) : options_(options), scale_(options.init_scale) {
  options_.validate();
}

void DynamicLossScaler::update(bool overflow) {
  ++updates_since_rescale_;
  if (!overflow) {
    if (++clean_updates_ >= options_.scale_window) {
      scale_ *= 2;
      clean_updates_ = 0;
      updates_since_rescale_ = 0;
      overflows_since_rescale_ = 0;
    }
    return;
  }
  ++total_overflows_;
  ++overflows_since_rescale_;
  clean_updates_ = 0;
  const double share = static_cast<double>(overflows_since_rescale_) / static_cast<double>(updates_since_rescale_);
  if (share < options_.tolerance) return;
  const double halved = scale_ / 2;
  scale_ = options_.threshold ? std::max(halved, *options_.threshold) : halved;
  updates_since_rescale_ = 0;
  overflows_since_rescale_ = 0;
  if (scale_ < options_.min_scale) {
    throw InputError(fmt::format("[fp16] the loss scale fell to {} after {} overflowing updates, below "
                                 "--min-loss-scale {}: the loss is probably diverging (inf or NaN). Lower --lr, "
                                 "use --clip-norm, enlarge the batch, or train with --bf16 or in fp32",
                                 scale_, total_overflows_, options_.min_scale));
  }
}

std::map<std::string, double> DynamicLossScaler::state() const {
  return {{"scale", scale_},
          {"clean_updates", static_cast<double>(clean_updates_)},
          {"updates_since_rescale", static_cast<double>(updates_since_rescale_)},
          {"overflows_since_rescale", static_cast<double>(overflows_since_rescale_)},
          {"overflows", static_cast<double>(total_overflows_)},
          {"scale_window", static_cast<double>(options_.scale_window)}};
}

void DynamicLossScaler::load_state(const std::map<std::string, double>& state, const std::string& source) {
  auto get = [&](const char* key) {
    auto it = state.find(key);
    if (it == state.end() || !std::isfinite(it->second) || it->second < 0) {
      throw InputError(fmt::format("{}: the loss scaler state has no valid '{}'", source, key));
    }
    return it->second;
  };
  const double scale = get("scale");
  if (!power_of_two(scale)) throw InputError(fmt::format("{}: the saved loss scale {} is not a power of two", source, scale));
  scale_ = scale;
  auto clean = static_cast<int64_t>(get("clean_updates"));
  const int64_t updates_since_rescale = static_cast<int64_t>(get("updates_since_rescale"));
  const int64_t overflows_since_rescale = static_cast<int64_t>(get("overflows_since_rescale"));
  const int64_t total_overflows = static_cast<int64_t>(get("overflows"));
  // See Note [Loss scale window on resume].
  const int64_t window = options_.scale_window;
  if (state.find("scale_window") == state.end()) {
    log::info("[fp16] {}: the loss scaler's state has no scale window (written by an earlier hetseq): its {} "
              "updates without overflow count toward this run's window of {}",
              source, clean, window);
  } else if (const double saved = get("scale_window"); saved < 1 || saved != std::floor(saved)) {
    throw InputError(fmt::format("{}: the loss scaler's saved window {} is not a positive whole number of updates",
                                 source, saved));
  } else if (const auto saved_window = static_cast<int64_t>(saved); saved_window != window) {
    const int64_t carried = static_cast<int64_t>((static_cast<__int128>(clean) * window) / saved_window);
    log::info("[fp16] {}: the loss scale window is {} updates now and was {} when saved (another --update-freq, "
              "world size or --fp16-scale-window): the {} updates without overflow toward it count as {}, the same "
              "share of the window (see Note [Loss scale window on resume])",
              source, window, saved_window, clean, carried);
    clean = carried;
  }
  clean_updates_ = clean;
  updates_since_rescale_ = updates_since_rescale;
  overflows_since_rescale_ = overflows_since_rescale;
  total_overflows_ = total_overflows;
}

}  // namespace hetseq
