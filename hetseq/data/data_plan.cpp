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

DataPlan DataPlan::from_shares(std::vector<int64_t> shares, std::vector<int64_t> micro_batches, int64_t rank,
                               Naming naming) {
  if (shares.size() != micro_batches.size()) {
    throw UsageError(fmt::format("data plan: {} shares with {} micro-batch counts", shares.size(), micro_batches.size()));
  }
  DataPlan plan;
  for (size_t r = 0; r < shares.size(); ++r) {
    plan.batch_sizes.push_back(micro_batches[r] > 0 ? (shares[r] + micro_batches[r] - 1) / micro_batches[r] : 0);
  }
  plan.shares = std::move(shares);
  plan.update_freqs = std::move(micro_batches);
  plan.rank = rank;
  plan.validate(naming);
  return plan;
}

int64_t DataPlan::share(int64_t r) const {
  return shares.empty() ? batch_sizes[r] * update_freqs[r] : shares[r];
}

std::vector<int64_t> DataPlan::all_shares() const {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < world_size(); ++r) out.push_back(share(r));
  return out;
}

int64_t DataPlan::samples_per_update() const {
  int64_t total = 0;
  for (int64_t r = 0; r < world_size(); ++r) total += share(r);
  return total;
}

int64_t DataPlan::slice_offset(int64_t r) const {
  int64_t offset = 0;
  for (int64_t q = 0; q < r; ++q) offset += share(q);
  return offset;
}

int64_t DataPlan::micro_batch_begin(int64_t r, int64_t k) const {
  // See Note [Data plan]: even cuts of the share; k * b_r when the share is b_r * u_r.
  return k * share(r) / update_freqs[r];
}

void DataPlan::validate(Naming naming) const {
  // Named in the caller's words: Note [Options in the user's words]. Python's Plan takes one value per rank.
  if (batch_sizes.empty() || batch_sizes.size() != update_freqs.size()) {
    throw UsageError(fmt::format("data plan: {} batch sizes ({}) for {} update frequencies ({}); give one value per "
                                 "rank{}",
                                 batch_sizes.size(), kBatchSizesOption.name(naming), update_freqs.size(),
                                 kUpdateFreqsOption.name(naming), naming == Naming::kPython ? "" : " or one for all"));
  }
  if (rank < 0 || rank >= world_size()) {
    throw UsageError(fmt::format("data plan: rank {} outside world size {}", rank, world_size()));
  }
  for (int64_t r = 0; r < world_size(); ++r) {
    if (sits_out(r)) continue;  // a balanced split's zero share: batch size 0 in one (empty) micro-batch
    if (batch_sizes[r] <= 0) {
      throw UsageError(fmt::format("{}: rank {} has batch size {}; it must be positive", kBatchSizesOption.name(naming),
                                   r, batch_sizes[r]));
    }
    if (update_freqs[r] <= 0) {
      throw UsageError(fmt::format("{}: rank {} has update frequency {}; it must be positive",
                                   kUpdateFreqsOption.name(naming), r, update_freqs[r]));
    }
  }
  if (shares.empty()) return;
  if (shares.size() != batch_sizes.size()) {
    throw UsageError(fmt::format("data plan: {} shares for {} ranks", shares.size(), batch_sizes.size()));
  }
  int64_t working = 0;
  for (int64_t r = 0; r < world_size(); ++r) {
    if (sits_out(r)) continue;
    ++working;
    if (shares[r] < update_freqs[r] || shares[r] > batch_sizes[r] * update_freqs[r]) {
      throw UsageError(fmt::format("data plan: rank {} has a share of {} samples in {} micro-batches of at most {}; "
                                   "a share needs at least one sample per micro-batch",
                                   r, shares[r], update_freqs[r], batch_sizes[r]));
    }
  }
  if (working == 0) throw UsageError("data plan: every rank's share is 0; at least one rank must train");
}

bool DataPlan::sits_out(int64_t r) const {
  return !shares.empty() && shares[static_cast<size_t>(r)] == 0 && update_freqs[static_cast<size_t>(r)] == 1;
}

}  // namespace hetseq
