#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hetseq/optim/lr_scheduler.h"

namespace hetseq::optim {

/// Options of the fixed schedule, named after fairseq's flags.
struct FixedOptions {
  std::vector<double> lrs;              ///< `--lr`, one lr per epoch (see Note [Per-epoch --lr lists]).
  std::optional<int64_t> force_anneal;  ///< `--force-anneal`: shrink the lr every epoch from this one on.
  double lr_shrink = 0.1;               ///< `--lr-shrink`: factor per annealed epoch.
  int64_t warmup_updates = 0;           ///< `--warmup-updates`: linear warmup over this many updates.
};

/// fairseq's fixed schedule: the lr of each epoch comes from the `--lr` list, then (with
/// `--force-anneal`) shrinks geometrically by `--lr-shrink` per epoch; during the first warmup_updates
/// updates it ramps linearly up to the epoch's lr.
class Fixed : public LrScheduler {
 public:
  /// Sets the optimizer's lr to lrs[0] / warmup_updates (lrs[0] without warmup). Throws
  /// hetseq::UsageError naming the flag on an empty or negative `--lr`, a negative `--lr-shrink` or
  /// `--warmup-updates`, or `--force-anneal` < 1.
  Fixed(Optimizer& optimizer, FixedOptions options);

  std::string name() const override { return "fixed"; }
  /// Takes the lr from the `--lr` list (lrs[epoch-1]) or anneals it, and sets warmup_factor * lr.
  double step(int64_t epoch, std::optional<double> val_loss = std::nullopt) override;
  /// During warmup (num_updates < warmup_updates) sets (num_updates+1)/warmup_updates * lr; after it,
  /// the epoch's lr.
  double step_update(int64_t num_updates) override;

  /// Adds "lr" (the epoch's base lr) and "warmup_factor".
  std::map<std::string, double> state() const override;
  void load_state(const std::map<std::string, double>& state) override;

 private:
  double get_next_lr(int64_t epoch) const;

  FixedOptions options_;
  double lr_;             // the base lr of the current epoch, before warmup
  double warmup_factor_;  // in (0, 1]; 1 once warmup is over
};

}  // namespace hetseq::optim
