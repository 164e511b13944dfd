#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "hetseq/optim/optimizer.h"

namespace hetseq::optim {

// Note [Per-epoch --lr lists]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `--lr` is a list, one learning rate per epoch (`--lr 0.25,0.1,0.05`); its last value holds for all
// later epochs. Epochs are 1-based. A schedule's constructor sets lrs[0], the lr of epoch 1, and the
// trainer calls step(e) at the END of epoch e, so step(e) sets the lr that epoch e+1 trains with.
//
// Both epoch-based schedules give epoch k the entry lrs[min(k-1, size-1)]: one entry per epoch.
//  - polynomial_decay (HetSeq's PolynomialDecaySchedule) computes it as lrs[min(e, size-1)] in
//    step(e), e being the 0-based index of epoch e+1.
//  - fixed (fairseq's FixedSchedule) is written, as in fairseq, for the epoch k about to begin,
//    lrs[k-1]; step(e) evaluates it for k = e+1.
// With `--force-anneal N`, the list is no longer read for epochs from N on: polynomial_decay keeps
// the optimizer's current lr (multiplied by its warmup factor again, as HetSeq does; the factor is 1
// after warmup), fixed uses lrs.back() * lr_shrink^(k + 1 - N) for epoch k.
// step_update() runs after every update and overrides what step() set (polynomial_decay decays from
// the epoch's lr_, fixed returns to it after warmup); see each schedule.

/// Base class of the learning-rate schedules (polynomial_decay, fixed, inverse_sqrt). A schedule sets
/// the lr of one Optimizer, which must outlive it. The trainer calls step_update() after every update
/// and step() at the end of every epoch. See Note [Per-epoch --lr lists] for the epoch numbering.
class LrScheduler {
 public:
  /// Schedules `optimizer`'s lr; subclasses set its initial lr in their constructor.
  explicit LrScheduler(Optimizer& optimizer);
  virtual ~LrScheduler();

  LrScheduler(const LrScheduler&) = delete;
  LrScheduler& operator=(const LrScheduler&) = delete;

  /// The schedule's name as given to `--lr-scheduler`.
  virtual std::string name() const = 0;

  /// Called at the end of `epoch` (1-based) with the validation loss if any; sets and returns the
  /// optimizer's lr for the next epoch. The base records the best (lowest) validation loss and
  /// returns the optimizer's lr unchanged.
  virtual double step(int64_t epoch, std::optional<double> val_loss = std::nullopt);

  /// Called after each update with the new total number of updates; sets and returns the lr. The base
  /// returns the optimizer's lr unchanged.
  virtual double step_update(int64_t num_updates);

  /// The best validation loss seen by step(), if any.
  std::optional<double> best() const { return best_; }

  /// The schedule's mutable state for checkpoints: "best" (when a validation loss was seen) and the
  /// fields of the subclass.
  virtual std::map<std::string, double> state() const;
  /// Restores a state(). Throws hetseq::InputError on an unknown or missing entry. It does not touch
  /// the optimizer's lr (restored by Optimizer::load_state, or set by the next step/step_update).
  virtual void load_state(const std::map<std::string, double>& state);

 protected:
  /// Throws hetseq::InputError naming the schedule when `state` lacks `key`; returns its value.
  double required_entry(const std::map<std::string, double>& state, const std::string& key) const;

  Optimizer& optimizer_;
  std::optional<double> best_;
};

}  // namespace hetseq::optim
