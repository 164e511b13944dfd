#pragma once

#include <string>

#include "hetseq/data/sample_id_log.h"
#include "hetseq/train/training_observer.h"

namespace hetseq {

/// --dump-sample-ids DIR: appends the sample indices of every update of this rank to
/// DIR/samples-rankR.txt (see SampleIdLog).
class SampleIdObserver final : public TrainingObserver {
 public:
  SampleIdObserver(const std::string& dir, int64_t rank) : log_(dir, rank) {}
  void on_update(const UpdateRecord& record) override {
    log_.write(record.epoch, record.num_updates, *record.sample_ids);
  }

 private:
  SampleIdLog log_;
};

}  // namespace hetseq
