#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "hetseq/optim/lr_scheduler.h"

namespace hetseq::optim {

/// The common part of the schedules with a per-epoch base lr and a linear warmup factor (fixed,
/// PolynomialDecayScheduler): the optimizer's lr is warmup_factor * lr, the base lr moves at each
/// epoch's end (lr_after_epoch), and both numbers are the schedule's checkpoint state.
class WarmupLrScheduler : public LrScheduler {
 public:
  /// Sets the optimizer's lr to first_lr / warmup_updates (first_lr without warmup).
  WarmupLrScheduler(Optimizer& optimizer, double first_lr, int64_t warmup_updates);

  /// Takes the base lr for after `epoch` from lr_after_epoch and sets warmup_factor * lr.
  double step(int64_t epoch, std::optional<double> val_loss = std::nullopt) override;

  /// Adds "lr" (the epoch's base lr) and "warmup_factor".
  std::map<std::string, double> state() const override;
  /// Restores a state(); throws hetseq::InputError naming the schedule on a value out of range.
  void load_state(const std::map<std::string, double>& state) override;

 protected:
  /// The base lr once `epoch` (1-based) has ended. See Note [Per-epoch --lr lists].
  virtual double lr_after_epoch(int64_t epoch) const = 0;

  double lr_;             // the base lr of the current epoch, before warmup (and decay)
  double warmup_factor_;  // in [0, 1]; 1 once warmup is over
};

}  // namespace hetseq::optim
