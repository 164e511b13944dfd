#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "hetseq/channel/late_sums.h"
#include "hetseq/task/task.h"

namespace hetseq {

class Tracer;

/// What the ranks agreed on in one update, besides the gradients.
struct UpdateAgreement {
  LogSums sums;             // the update's statistics summed over the ranks (sample_size included), but `late`'s
  bool stop = false;        // some rank voted to stop the run after this update (Note [Clean stops])
  LateSums late;            // the device statistics summed over the ranks, still on the device: read them late
  int64_t host_reads = 0;   // reads of the device the round made (names that changed: Note [Stat sync])
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

  /// Starts summing an update's statistics, `local` on the host and `device_values` on the device (float64
  /// scalars; complete: the task's last micro-batch has its loss), with this rank's `stop` vote, and returns:
  /// the collectives are in flight while backward runs, and nothing waits for the device. Every rank calls
  /// finish_update() after backward and before the channel's next message.
  virtual void start_update(const LogSums& local, const LogTensors& device_values, bool stop) = 0;
  void start_update(const LogSums& local, bool stop) { start_update(local, LogTensors{}, stop); }
  /// Whether an update's statistics were started and not finished.
  virtual bool update_started() const = 0;
  /// The started update's sample count summed over the ranks: waits for the started collective only, and
  /// is what the comm hooks of the gradient buckets divide by during backward (Note [Comm hooks]).
  virtual double update_sample_size() = 0;
  /// Waits for the started update's statistics: their sums over all ranks and the stop vote, and the device
  /// statistics' sums on the device, which the host reads when the device has finished them.
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
  using CollectiveChannel::start_update;
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  void start_update(const LogSums& local, const LogTensors& device_values, bool stop) override {
    pending_ = UpdateAgreement{local, stop, {}};
    pending_tensors_ = device_values;
  }
  bool update_started() const override { return pending_.has_value(); }
  double update_sample_size() override { return sum_or(pending_.value().sums, "sample_size"); }
  UpdateAgreement finish_update() override;
  LogSums sum(const LogSums& local) override { return local; }
  const std::vector<LogSums>& last_per_rank() const override { return no_ranks_; }
  std::vector<std::vector<double>> gather(const std::vector<double>& local) override { return {local}; }

 private:
  std::optional<UpdateAgreement> pending_;
  LogTensors pending_tensors_;  // the device statistics, stacked at finish_update (after a graph's replay)
  std::vector<LogSums> no_ranks_;
};

}  // namespace hetseq
