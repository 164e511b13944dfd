#include "hetseq/train/straggler_report.h"

#include "hetseq/core/logging.h"

namespace hetseq {

void StragglerReport::on_update(const UpdateRecord& record) {
  compute_s_ += record.times.compute_s;
  wait_s_ += record.times.comm_wait_s;
  if (++count_ % log_interval_ != 0) return;
  log::info("[reducer] update {}: {} samples, compute {:.1f} ms/update, waiting on communication {:.1f} ms/update",
            record.num_updates, record.shares[static_cast<size_t>(record.rank)],
            1e3 * compute_s_ / static_cast<double>(log_interval_), 1e3 * wait_s_ / static_cast<double>(log_interval_));
  compute_s_ = wait_s_ = 0;
}

}  // namespace hetseq
