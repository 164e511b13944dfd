#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hetseq/optim/lr_scheduler.h"

namespace hetseq::optim {

/// Options of the inverse_sqrt schedule, named after fairseq's flags.
struct InverseSqrtOptions {
  std::vector<double> lrs;                ///< `--lr`: exactly one value, the lr at the end of warmup.
  int64_t warmup_updates = 4000;          ///< `--warmup-updates`: >= 1.
  std::optional<double> warmup_init_lr;  ///< `--warmup-init-lr`: the lr at update 0; default 0.
};

/// fairseq's inverse_sqrt schedule (Transformer): linear warmup from warmup_init_lr to lr over
/// warmup_updates updates, then lr * sqrt(warmup_updates / num_updates).
class InverseSqrt : public LrScheduler {
 public:
  /// Sets the optimizer's lr to warmup_init_lr. Throws hetseq::UsageError naming the flag when `--lr`
  /// does not have exactly one value or is negative, `--warmup-updates` < 1 (the decay is scaled by
  /// it) or `--warmup-init-lr` is negative.
  InverseSqrt(Optimizer& optimizer, InverseSqrtOptions options);

  std::string name() const override { return "inverse_sqrt"; }
  /// warmup_init_lr + num_updates * (lr - warmup_init_lr) / warmup_updates during warmup, then
  /// lr * sqrt(warmup_updates) / sqrt(num_updates).
  double step_update(int64_t num_updates) override;

 private:
  double warmup_init_lr_;
  double lr_step_;       // lr increment per warmup update
  double decay_factor_;  // lr * sqrt(warmup_updates)
  int64_t warmup_updates_;
};

}  // namespace hetseq::optim
