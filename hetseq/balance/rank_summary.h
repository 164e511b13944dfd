#pragma once

#include <cstdint>
#include <vector>

#include "hetseq/balance/auto_balancer.h"
#include "hetseq/observe/progress.h"
#include "hetseq/train/training_observer.h"

namespace hetseq {

/// When the per-rank summary is logged.
struct RankSummaryOptions {
  int64_t log_interval = 100;  // --log-interval: a `ranks` JSON record every this many updates
  bool log_all_ranks = false;  // --log-all-ranks: the text lines at every interval too, not only per epoch
  int64_t world_size = 1;
};

/// The straggler summary: where each rank's time goes. Every --log-interval updates and at the end of
/// every epoch the ranks gather, over the interval (or epoch), their samples per update, compute per
/// update and per sample, time waiting on communication (ms and share of the update) and the bus
/// bandwidth of their allreduces; rank 0 marks the slowest rank (the most compute per update) and,
/// with --auto-balance off, adds the split the balancer would choose and its predicted gain. Rank 0
/// logs one text line per rank at each epoch's end (and at every interval with --log-all-ranks), and
/// a record to the JSON outputs every time (one array per figure, indexed by rank): `ranks` for an
/// interval, `ranks_epoch` for an epoch.
/// Every rank runs it: the gather is a collective.
class RankSummary final : public TrainingObserver {
 public:
  /// `balancer` (may be null) must be added to the loop before this observer, so that its epoch
  /// suggestion is ready when this one reports.
  RankSummary(GatherFn gather, ProgressLogger& logger, const AutoBalancer* balancer, RankSummaryOptions options);

  void on_update(const UpdateRecord& record) override;
  void add_epoch_stats(int64_t epoch, std::vector<Stat>& stats) override;

 private:
  struct Totals {  // this rank's, over an interval or an epoch
    double updates = 0, samples = 0, compute_s = 0, wait_s = 0, total_s = 0, busy_s = 0, bytes = 0, share = 0;
  };
  static void add(Totals& into, const UpdateRecord& record);
  void report(int64_t epoch, int64_t num_updates, const Totals& mine, bool text, bool epoch_end);

  GatherFn gather_;
  ProgressLogger& logger_;
  const AutoBalancer* balancer_;
  RankSummaryOptions options_;
  Totals interval_, epoch_;
  int64_t rank_ = 0;
  int64_t num_updates_ = 0;
};

}  // namespace hetseq
