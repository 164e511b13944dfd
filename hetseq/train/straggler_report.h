#pragma once

#include <cstdint>

#include "hetseq/train/training_observer.h"

namespace hetseq {

/// --log-all-ranks: every --log-interval updates, each rank logs its batch size and its compute and
/// communication-wait time per update. A rank that computes long and waits little holds the others up.
class StragglerReport final : public TrainingObserver {
 public:
  explicit StragglerReport(int64_t log_interval) : log_interval_(log_interval) {}
  void on_update(const UpdateRecord& record) override;

 private:
  int64_t log_interval_;
  int64_t count_ = 0;
  double compute_s_ = 0, wait_s_ = 0;  // over the current interval
};

}  // namespace hetseq
