#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace hetseq {

/// Dynamic loss scaling for float16 training (--fp16). See Note [Loss scaling].
struct LossScalerOptions {
  double init_scale = 128;           // --fp16-init-scale: a power of two
  int64_t scale_window = 2000;       // --fp16-scale-window: updates without overflow before the scale doubles
  double tolerance = 0;              // --fp16-scale-tolerance: share of overflowing updates since the last
                                     // rescale that is tolerated before the scale halves (0: halve on each)
  double min_scale = 1e-4;           // --min-loss-scale: below it training stops with an error
  std::optional<double> threshold;   // --threshold-loss-scale: the scale never halves below it (a power of two)

  /// Throws hetseq::UsageError naming the flag of an invalid value.
  void validate() const;
};

/// The loss scale and its schedule: the scale doubles after `scale_window` updates in a row without
/// overflow and halves on an overflow (subject to `tolerance` and `threshold`). Every rank keeps its own
/// copy and feeds it the same overflow decisions, so the copies stay equal. See Note [Loss scaling].
class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerOptions options);

  /// The factor the loss is multiplied by before backward (a power of two).
  double scale() const { return scale_; }

  /// Records whether the gradients of the update just computed overflowed (the update is then skipped
  /// by the caller) and moves the scale. Throws hetseq::InputError when an overflow takes the scale
  /// below --min-loss-scale: the loss is diverging, and no scale will save it.
  void update(bool overflow);

  /// Updates and overflows seen, for logs.
  int64_t overflows() const { return total_overflows_; }

  /// The scale, the counters that schedule it and the window they count toward, as named numbers (for
  /// checkpoints).
  std::map<std::string, double> state() const;
  /// Restores a state(); a state saved under another scale window (another split under the default
  /// window, or another --fp16-scale-window) has its count of updates without overflow carried as the
  /// same share of this window, logged. See Note [Loss scale window on resume]. Throws
  /// hetseq::InputError naming `source` on a missing or impossible entry.
  void load_state(const std::map<std::string, double>& state, const std::string& source);

  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t clean_updates_ = 0;            // updates without overflow since the last overflow or growth
  int64_t updates_since_rescale_ = 0;    // updates (with or without overflow) since the scale last moved
  int64_t overflows_since_rescale_ = 0;
  int64_t total_overflows_ = 0;
};

}  // namespace hetseq
