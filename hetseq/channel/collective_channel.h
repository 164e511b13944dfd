#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "hetseq/task/task.h"

namespace hetseq {

class Tracer;

/// What the ranks agreed on in one update, besides the gradients.
struct UpdateAgreement {
  LogSums sums;             // the update's statistics summed over the ranks (sample_size included)
  bool stop = false;        // some rank voted to stop the run after this update (Note [Clean stops])
};

/// Every collective of a run that is not a gradient: an update's statistics with the stop vote, the sums
/// of a validation, and gathers of per-rank figures (timing, the balancer's measurements). Each message
/// has its own type; the gradients go through the GradientReducer alone. Every rank calls the same
/// methods in the same order. See Note [Communication roles].
class CollectiveChannel {
 public:
  virtual ~CollectiveChannel() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;

  /// Starts summing an update's statistics `local` (complete: the task's last micro-batch has its loss)
  /// with this rank's `stop` vote, and returns: one collective, in flight while backward runs. Every rank
  /// calls finish_update() after backward and before the channel's next message.
  virtual void start_update(const LogSums& local, bool stop) = 0;
  /// Whether an update's statistics were started and not finished.
  virtual bool update_started() const = 0;
  /// The started update's sample count summed over the ranks: waits for the started collective only, and
  /// is what the comm hooks of the gradient buckets divide by during backward (Note [Comm hooks]).
  virtual double update_sample_size() = 0;
  /// Waits for the started update's statistics: their sums over all ranks and the stop vote.
  virtual UpdateAgreement finish_update() = 0;
  /// Sums statistics over the ranks (a validation), in one blocking call.
  virtual LogSums sum(const LogSums& local) = 0;
  /// Each rank's sums of the last finish_update() or sum(), [rank]; empty where the channel keeps only
  /// the totals (--fast-stat-sync, one process).
  virtual const std::vector<LogSums>& last_per_rank() const = 0;
  /// Every rank's `local` figures, [rank][k]; `local` has the same length on every rank.
  virtual std::vector<std::vector<double>> gather(const std::vector<double>& local) = 0;
  /// Spans of the statistics collective go to `tracer` (null: none). See Note [Tracing].
  virtual void set_tracer(std::shared_ptr<Tracer> tracer) {}
};

/// One process: every message is its own answer.
class LocalChannel final : public CollectiveChannel {
 public:
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  void start_update(const LogSums& local, bool stop) override { pending_ = UpdateAgreement{local, stop}; }
  bool update_started() const override { return pending_.has_value(); }
  double update_sample_size() override { return sum_or(pending_.value().sums, "sample_size"); }
  UpdateAgreement finish_update() override;
  LogSums sum(const LogSums& local) override { return local; }
  const std::vector<LogSums>& last_per_rank() const override { return no_ranks_; }
  std::vector<std::vector<double>> gather(const std::vector<double>& local) override { return {local}; }

 private:
  std::optional<UpdateAgreement> pending_;
  std::vector<LogSums> no_ranks_;
};

}  // namespace hetseq
