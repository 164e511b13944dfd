#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hetseq/train/controller.h"
#include "hetseq/observe/progress.h"

namespace hetseq {

/// Where the wall time of one update went on this rank, in seconds.
struct PhaseTimes {
  double data_s = 0;       // waiting for the update's batches (collation not hidden by prefetching)
  double compute_s = 0;    // forward, backward and step, without the wait below
  double comm_wait_s = 0;  // backward waiting on the gradient reduction after its last bucket was ready
  double comm_busy_s = 0;  // time at least one gradient bucket's allreduce was in flight (overlaps compute)
  int64_t comm_bytes = 0;  // gradient bytes this rank put into the reduction
  double total_s = 0;      // the whole update, data included
};

/// What the training loop tells its observers after every update.
struct UpdateRecord {
  int64_t epoch = 1;
  int64_t num_updates = 0;      // after this update
  int64_t index_in_epoch = 0;   // 1-based among the updates this run trains in the epoch
  int64_t updates_in_epoch = 0; // updates this run trains in the epoch
  int64_t rank = 0;
  const std::vector<std::vector<int64_t>>* sample_ids = nullptr;  // this rank's [micro-batch][sample index]
  std::vector<int64_t> batch_sizes;                               // [rank] micro-batch sizes of the plan
  std::vector<int64_t> shares;                                    // [rank] samples per update of the plan
  const UpdateResult* result = nullptr;
  PhaseTimes times;
};

/// Watches the training loop: logging, sample-id dumps, straggler reports, traces and balancers each
/// are one observer; none is an `if` inside the loop. Callbacks run on every rank, in the training
/// thread, in the order the observers were added. See TrainingLoop.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  /// Before the first update of `epoch` (also when a resumed run continues inside it).
  virtual void on_epoch_begin(int64_t epoch) {}
  /// After every update (a skipped fp16 update included: see UpdateResult::skipped).
  virtual void on_update(const UpdateRecord& record) {}
  /// After the last update that this run trains in `epoch`, before on_epoch_end: adds figures to the
  /// epoch's summary line (every rank calls it at the same point, so it may communicate).
  virtual void add_epoch_stats(int64_t epoch, std::vector<Stat>& stats) {}
  /// After the last update that this run trains in `epoch`, with the epoch's statistics.
  virtual void on_epoch_end(int64_t epoch, const std::vector<Stat>& stats) {}
  /// After a validation pass over `split`.
  virtual void on_validation(int64_t epoch, const std::string& split, const std::vector<Stat>& stats) {}
  /// When training stops: the last epoch trained and the update count.
  virtual void on_train_end(int64_t last_epoch, int64_t num_updates) {}
};

}  // namespace hetseq
