#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hetseq/optim/warmup_lr_scheduler.h"

namespace hetseq::optim {

/// Options of the polynomial_decay schedule, named after HetSeq's flags.
struct PolynomialDecayOptions {
  std::vector<double> lrs;             ///< `--lr`, one lr per epoch (see Note [Per-epoch --lr lists]).
  int64_t warmup_updates = 0;          ///< `--warmup-updates`: linear warmup over this many updates.
  std::optional<int64_t> force_anneal;  ///< `--force-anneal`: stop reading `lrs` from this epoch on.
  double end_learning_rate = 0;        ///< `--end-learning-rate`: the lr from total_num_update on.
  double power = 1.0;                  ///< `--power`: exponent of the decay.
  int64_t total_num_update = 1000000;  ///< `--total-num-update`: the update where decay ends.
};

/// HetSeq's polynomial_decay schedule (BERT pre-training): linear warmup from 0 to lr over
/// warmup_updates, then lr decays as (lr - end) * (1 - (n - warmup)/(total - warmup))^power + end,
/// and stays at end_learning_rate from total_num_update on.
class PolynomialDecay : public WarmupLrScheduler {
 public:
  /// Sets the optimizer's lr to lrs[0] / warmup_updates (lrs[0] without warmup). Throws
  /// hetseq::UsageError naming the flag on an empty `--lr`, a negative lr or `--end-learning-rate`,
  /// `--power` <= 0, negative `--warmup-updates`, `--total-num-update` <= `--warmup-updates` or
  /// `--force-anneal` < 1.
  PolynomialDecay(Optimizer& optimizer, PolynomialDecayOptions options);

  std::string name() const override { return "PolynomialDecayScheduler"; }
  /// Sets the warmup or decayed lr for `num_updates` (closed form above).
  double step_update(int64_t num_updates) override;

 protected:
  double lr_after_epoch(int64_t epoch) const override;

 private:
  double get_next_lr(int64_t epoch) const;

  PolynomialDecayOptions options_;
};

}  // namespace hetseq::optim
