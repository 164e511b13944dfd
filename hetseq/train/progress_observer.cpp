#include "hetseq/train/progress_observer.h"

#include "hetseq/core/logging.h"

namespace hetseq {

void ProgressObserver::on_update(const UpdateRecord& record) {
  if (record.result->skipped) return;  // consumed its batches but trained nothing
  logger_.on_update(record.epoch, record.index_in_epoch, record.updates_in_epoch, [&] {
    std::vector<Stat> stats = controller_.train_stats();
    // Each rank's samples of this update (its share of the split, Note [Balancing]).
    if (record.shares.size() > 1) stats.push_back({"split", 0, true, record.shares});
    return stats;
  });
}

void ProgressObserver::on_epoch_end(int64_t epoch, const std::vector<Stat>& stats) {
  logger_.log(epoch, "train_epoch", stats);
}

void ProgressObserver::on_validation(int64_t epoch, const std::string& split, const std::vector<Stat>& stats) {
  logger_.log(epoch, "valid", stats, split);
}

void ProgressObserver::on_train_end(int64_t last_epoch, int64_t num_updates) {
  log::info("[train] done: {} updates, last epoch {}, {:.1f} s", num_updates, last_epoch,
            controller_.meters().wall.elapsed_s());
}

}  // namespace hetseq
