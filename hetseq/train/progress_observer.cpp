#include "hetseq/train/progress_observer.h"

#include "hetseq/core/logging.h"

namespace hetseq {

void ProgressObserver::on_update(const UpdateRecord& record) {
  if (record.result->skipped) return;  // consumed its batches but trained nothing
  logger_.on_update(record.epoch, record.index_in_epoch, record.updates_in_epoch, [&] {
    std::vector<Stat> stats = controller_.train_stats();
    // Each rank's samples of this update (its share of the split, Note [Balancing]).
    if (record.shares.size() > 1) stats.push_back({"split", 0, true, record.shares});
    stats.push_back(wall_s());
    return stats;
  });
}

void ProgressObserver::on_epoch_end(int64_t epoch, const std::vector<Stat>& stats) {
  std::vector<Stat> with_time = stats;
  with_time.push_back(wall_s());
  logger_.log(epoch, "train_epoch", with_time);
}

void ProgressObserver::on_validation(int64_t epoch, const std::string& split, const std::vector<Stat>& stats) {
  std::vector<Stat> with_time = stats;
  with_time.push_back(wall_s());
  logger_.log(epoch, "valid", with_time, split);
}

Stat ProgressObserver::wall_s() const {
  return Stat{"wall_s", controller_.meters().wall.elapsed_s(), false, {}, {}, /*json_only=*/true};
}

void ProgressObserver::on_train_end(int64_t last_epoch, int64_t num_updates) {
  log::info("[train] done: {} updates, last epoch {}, {:.1f} s", num_updates, last_epoch,
            controller_.meters().wall.elapsed_s());
}

}  // namespace hetseq
