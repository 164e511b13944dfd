#pragma once

#include "hetseq/train/controller.h"
#include "hetseq/observe/progress.h"
#include "hetseq/train/training_observer.h"

namespace hetseq {

/// The log lines of a run (--log-format, --log-interval, the progress bar): `train` every
/// --log-interval updates, `train_epoch` at each epoch's end, `valid` after each validation, and the
/// closing `[train] done` line. A skipped fp16 update logs nothing.
class ProgressObserver final : public TrainingObserver {
 public:
  ProgressObserver(ProgressLogger& logger, Controller& controller) : logger_(logger), controller_(controller) {}

  void on_update(const UpdateRecord& record) override;
  void on_epoch_end(int64_t epoch, const std::vector<Stat>& stats) override;
  void on_validation(int64_t epoch, const std::string& split, const std::vector<Stat>& stats) override;
  void on_train_end(int64_t last_epoch, int64_t num_updates) override;

 private:
  /// Seconds since the run started, for the JSON outputs (plots against wall time).
  Stat wall_s() const;
  ProgressLogger& logger_;
  Controller& controller_;
};

}  // namespace hetseq
