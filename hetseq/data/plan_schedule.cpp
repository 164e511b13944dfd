#include "hetseq/data/plan_schedule.h"

#include <algorithm>

#include "hetseq/core/error.h"

namespace hetseq {
namespace {

int64_t for_epoch(const std::vector<int64_t>& values, int64_t epoch) {
  return values[std::min<size_t>(static_cast<size_t>(epoch - 1), values.size() - 1)];
}

}  // namespace

// Note [Plan schedule]
// ~~~~~~~~~~~~~~~~~~~~
// An update consumes the next U = sum_r u_r * b_r samples of the epoch's permutation (Note [Data
// plan]). The position inside the epoch is one offset into that permutation, so the split of U
// across ranks may change between any two updates: the next update still takes the next U samples,
// only the cut between ranks moves. With U fixed, step k of the epoch is the same set of samples
// whatever the split, every sample is used once per epoch, and the number of updates per epoch and
// the LR schedule stay what the user configured. set_split therefore refuses a split with another U.
// The split stays in force across epochs as long as the configured U of the epoch (from the
// --update-freq lists) equals its U; an epoch with another U starts from the configured plan.
PlanSchedule::PlanSchedule(std::vector<int64_t> batch_sizes, std::vector<std::vector<int64_t>> update_freqs,
                           std::vector<int64_t> valid_batch_sizes, int64_t rank)
    : batch_sizes_(std::move(batch_sizes)),
      update_freqs_(std::move(update_freqs)),
      valid_batch_sizes_(std::move(valid_batch_sizes)),
      rank_(rank) {
  if (batch_sizes_.size() != update_freqs_.size() || batch_sizes_.size() != valid_batch_sizes_.size()) {
    throw UsageError(fmt::format("plan schedule: {} batch sizes, {} update-freq lists and {} validation batch sizes; "
                                 "give one of each per rank",
                                 batch_sizes_.size(), update_freqs_.size(), valid_batch_sizes_.size()));
  }
  for (size_t r = 0; r < update_freqs_.size(); ++r) {
    if (update_freqs_[r].empty()) throw UsageError(fmt::format("--update-freq: rank {} has an empty list", r));
    for (int64_t u : update_freqs_[r]) {
      if (u <= 0) throw UsageError(fmt::format("--update-freq: rank {} has {}; it must be positive", r, u));
    }
  }
  configured(1);  // validates
  valid_plan().validate();
}

DataPlan PlanSchedule::configured(int64_t epoch) const {
  DataPlan plan;
  plan.batch_sizes = batch_sizes_;
  for (const auto& uf : update_freqs_) plan.update_freqs.push_back(for_epoch(uf, epoch));
  plan.rank = rank_;
  plan.validate();
  return plan;
}

DataPlan PlanSchedule::train_plan(int64_t epoch) const {
  DataPlan plan = configured(epoch);
  if (split_ && split_->samples_per_update() == plan.samples_per_update()) return *split_;
  return plan;
}

DataPlan PlanSchedule::valid_plan() const {
  DataPlan plan;
  plan.batch_sizes = valid_batch_sizes_;
  plan.update_freqs.assign(valid_batch_sizes_.size(), 1);
  plan.rank = rank_;
  return plan;
}

// Note [Validating a balanced split]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Validation is a pass over the split in which every rank takes a slice of each step, summed over the ranks
// (exact whatever the slices: Validator::run). With the configured plan, each rank's slice is its validation
// batch size, so a rank that the balancer found slow, or sat out (Note [Sitting out]), holds every validation
// back for as long as its equal slice takes it. Under a balanced split the V = sum_r vb_r samples of a step
// (vb_r: rank r's validation batch size) are cut in proportion to the training shares s_r instead,
//   v_r = floor(V s_r / S), the remainder one each to the ranks with the largest fractions (lowest rank first),
// in ceil(v_r / vb_r) micro-batches, so no batch exceeds what the rank was configured to validate at once. A
// rank with s_r = 0 validates nothing and only joins the sums.

DataPlan PlanSchedule::valid_plan(int64_t epoch) const {
  const DataPlan train = train_plan(epoch);
  if (train.shares.empty()) return valid_plan();
  const std::vector<int64_t> shares = train.all_shares();  // [rank]
  const auto world = static_cast<size_t>(world_size());
  int64_t total_valid = 0, total_train = 0;
  for (size_t r = 0; r < world; ++r) {
    total_valid += valid_batch_sizes_[r];
    total_train += shares[r];
  }
  if (total_train <= 0) return valid_plan();
  std::vector<int64_t> v(world);
  std::vector<std::pair<int64_t, size_t>> fractions;  // [rank with a share] (remainder numerator, rank)
  int64_t given = 0;
  for (size_t r = 0; r < world; ++r) {
    v[r] = total_valid * shares[r] / total_train;
    given += v[r];
    if (shares[r] > 0) fractions.emplace_back(total_valid * shares[r] % total_train, r);
  }
  std::stable_sort(fractions.begin(), fractions.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < total_valid && !fractions.empty(); i = (i + 1) % fractions.size(), ++given) {
    ++v[fractions[i].second];
  }
  std::vector<int64_t> micro_batches(world);
  for (size_t r = 0; r < world; ++r) {
    micro_batches[r] = std::max<int64_t>(1, (v[r] + valid_batch_sizes_[r] - 1) / valid_batch_sizes_[r]);
  }
  return DataPlan::from_shares(std::move(v), std::move(micro_batches), rank_);
}

void PlanSchedule::set_split(int64_t epoch, std::vector<int64_t> batch_sizes, std::vector<int64_t> update_freqs) {
  DataPlan after;
  after.batch_sizes = std::move(batch_sizes);
  after.update_freqs = std::move(update_freqs);
  after.rank = rank_;
  apply(epoch, std::move(after));
}

void PlanSchedule::set_shares(int64_t epoch, std::vector<int64_t> shares, std::vector<int64_t> micro_batches) {
  apply(epoch, DataPlan::from_shares(std::move(shares), std::move(micro_batches), rank_));
}

void PlanSchedule::apply(int64_t epoch, DataPlan after) {
  const DataPlan before = train_plan(epoch);
  if (after.batch_sizes.size() != before.batch_sizes.size()) {
    throw UsageError(fmt::format("plan schedule: a split for {} ranks in a world of {}", after.batch_sizes.size(),
                                 before.batch_sizes.size()));
  }
  after.validate();
  if (after.samples_per_update() != before.samples_per_update()) {
    throw UsageError(fmt::format("plan schedule: the new split takes {} samples per update, the run takes {}; a split "
                                 "may move samples between ranks but not change their total (see Note [Plan schedule])",
                                 after.samples_per_update(), before.samples_per_update()));
  }
  split_ = std::move(after);
  ++version_;
}

int64_t PlanSchedule::micro_batches_per_update(int64_t epoch) const {
  int64_t total = 0;
  for (int64_t u : train_plan(epoch).update_freqs) total += u;
  return total;
}

}  // namespace hetseq
