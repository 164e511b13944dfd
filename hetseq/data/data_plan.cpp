#include "hetseq/data/data_plan.h"

#include "hetseq/core/error.h"

namespace hetseq {

DataPlan DataPlan::single(int64_t batch_size, int64_t update_freq) {
  DataPlan plan;
  plan.batch_sizes = {batch_size};
  plan.update_freqs = {update_freq};
  plan.rank = 0;
  plan.validate();
  return plan;
}

int64_t DataPlan::samples_per_update() const {
  int64_t total = 0;
  for (int64_t r = 0; r < world_size(); ++r) total += batch_sizes[r] * update_freqs[r];
  return total;
}

int64_t DataPlan::slice_offset(int64_t r) const {
  int64_t offset = 0;
  for (int64_t q = 0; q < r; ++q) offset += batch_sizes[q] * update_freqs[q];
  return offset;
}

void DataPlan::validate() const {
  if (batch_sizes.empty() || batch_sizes.size() != update_freqs.size()) {
    throw UsageError(fmt::format("data plan: {} batch sizes (--max-sentences) for {} update frequencies "
                                 "(--update-freq); give one value per rank or one for all",
                                 batch_sizes.size(), update_freqs.size()));
  }
  if (rank < 0 || rank >= world_size()) {
    throw UsageError(fmt::format("data plan: rank {} outside world size {}", rank, world_size()));
  }
  for (int64_t r = 0; r < world_size(); ++r) {
    if (batch_sizes[r] <= 0) {
      throw UsageError(fmt::format("--max-sentences: rank {} has batch size {}; it must be positive", r,
                                   batch_sizes[r]));
    }
    if (update_freqs[r] <= 0) {
      throw UsageError(fmt::format("--update-freq: rank {} has update frequency {}; it must be positive", r,
                                   update_freqs[r]));
    }
  }
}

}  // namespace hetseq
