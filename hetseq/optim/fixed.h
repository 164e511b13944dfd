#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hetseq/optim/warmup_lr_scheduler.h"

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
class Fixed : public WarmupLrScheduler {
 public:
  /// Sets the optimizer's lr to lrs[0] / warmup_updates (lrs[0] without warmup). Throws
  /// hetseq::UsageError naming the flag on an empty or negative `--lr`, a negative `--lr-shrink` or
  /// `--warmup-updates`, or `--force-anneal` < 1.
  Fixed(Optimizer& optimizer, FixedOptions options);

  std::string name() const override { return "fixed"; }
  /// During warmup (num_updates < warmup_updates) sets (num_updates+1)/warmup_updates * lr; after it,
  /// the epoch's lr.
  double step_update(int64_t num_updates) override;

 protected:
  double lr_after_epoch(int64_t epoch) const override;

 private:
  double get_next_lr(int64_t epoch) const;

  FixedOptions options_;
};

}  // namespace hetseq::optim
