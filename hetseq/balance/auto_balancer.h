#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "hetseq/balance/cost_window.h"
#include "hetseq/data/plan_schedule.h"
#include "hetseq/train/training_observer.h"

namespace hetseq {

/// How the split of each update is balanced (the Balancing flags). See Note [Balancing].
struct BalanceOptions {
  bool enabled = false;        // --auto-balance: apply new splits; off: measure, report and suggest
  int64_t interval = 10;       // --balance-interval: updates between two re-plans
  double threshold = 0.03;     // --balance-threshold: predicted gain a new split must bring
  bool widen_to_noise = true;  // widen the threshold to the measured noise (when the flag is not given)
  std::vector<int64_t> caps;   // [rank] --balance-cap: the largest micro-batch (0: no limit)
  int64_t multiple = 1;        // --required-batch-size-multiple
  int64_t window = 0;          // measurements kept per rank (0: --balance-interval, at least 4)
  bool sit_out = false;        // a rank other than 0 may get a share of 0 (Note [Sitting out])
};

/// Every rank's `local` vector (the same length on every rank), [rank][k]. Every rank calls it at the
/// same point; a run's is CollectiveChannel::gather.
using GatherFn = std::function<std::vector<std::vector<double>>(const std::vector<double>& local)>;

/// The automatic balancer, one observer per rank. It times each rank's compute per update (data wait,
/// forward and backward, without the wait in collectives), keeps a window of those measurements, and
/// every --balance-interval updates gathers every rank's fitted cost, solves for equal finish times and
/// applies the new split to the PlanSchedule when it is predicted to be faster by more than the
/// threshold. Every rank computes the same split from the same gathered figures. At the end of each
/// epoch it adds `balance_eff` (measured samples/s over what the ranks' compute speeds allow) to the
/// summary and, when off, suggests --auto-balance if it would gain. See Note [Balancing].
class AutoBalancer final : public TrainingObserver {
 public:
  AutoBalancer(PlanSchedule& schedule, GatherFn gather, BalanceOptions options);

  void on_epoch_begin(int64_t epoch) override;
  void on_update(const UpdateRecord& record) override;
  void add_epoch_stats(int64_t epoch, std::vector<Stat>& stats) override;

  /// This rank's figures for a re-plan (its fitted cost, its window's noise, its totals): what a rank that
  /// sits out posts for the others (Note [Sharing an update]).
  std::vector<double> figures() const { return local_figures(); }
  /// A measurement of this rank that is not an update: a probe while it sits out.
  void add_probe(const CostSample& sample) { window_.add(sample); }

  /// Splits applied so far by this process.
  int64_t changes() const { return changes_; }
  /// What balancing would do, with --auto-balance off: the split and its predicted speed-up per update.
  struct Suggestion {
    std::vector<int64_t> shares;  // [rank]
    double gain = 1;              // predicted step time now over the step time with `shares`
  };
  /// Rank 0: the suggestion of the last epoch's end, when the balancer found one worth switching to.
  const std::optional<Suggestion>& suggestion() const { return suggestion_; }

 private:
  struct Totals {  // compute and step wall time over the updates measured
    double compute_s = 0, samples = 0, step_s = 0, steps = 0;
  };
  std::vector<double> local_figures() const;
  SplitProblem problem(const std::vector<std::vector<double>>& all, int64_t samples_per_update) const;
  /// The predicted gain a new split must bring: --balance-threshold, or (widen_to_noise) twice the
  /// noisiest rank's relative error when that is larger, at most 50%.
  double deadband(const std::vector<std::vector<double>>& all, const std::vector<int64_t>& shares) const;
  void replan(const UpdateRecord& record);
  void suggest(int64_t epoch, const std::vector<std::vector<double>>& all);

  PlanSchedule& schedule_;
  GatherFn gather_;
  BalanceOptions options_;
  CostWindow window_;
  Totals epoch_, since_change_;  // this epoch; since the last applied split
  std::vector<int64_t> shares_;  // [rank] the split of the last update
  int64_t rank_ = 0;
  int64_t updates_ = 0;          // updates this process has run
  int64_t planned_at_ = -1;      // num_updates of the last re-plan
  int64_t changes_ = 0;
  std::optional<double> predicted_s_;  // the predicted compute per update of the split in force
  std::optional<Suggestion> suggestion_;
};

}  // namespace hetseq
