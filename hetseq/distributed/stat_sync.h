#pragma once

#include <cstdint>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hetseq/task/task.h"

namespace hetseq {

/// Sums the statistics of a step (LogSums) over the ranks of a process group. The distributed
/// reducer calls it at the end of every update and for validation. See Note [Stat sync].
class StatSync {
 public:
  /// `fast` (--fast-stat-sync): one allreduce of a float64 tensor (two when the names change, on all
  /// ranks together); every rank must report the same names. Otherwise two allgathers of every rank's
  /// sums, which tolerate different names and keep each rank's values. `device`: where the
  /// collectives' tensors live (the model's device, so that an NCCL group can carry them).
  StatSync(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device, bool fast);

  /// The elementwise sum of `local` over all ranks (a name missing on a rank counts 0 there). Every
  /// rank must call it at the same point. Throws hetseq::InputError naming the ranks when, with
  /// `fast`, the ranks report different names, and when a collective fails or times out.
  LogSums sum(const LogSums& local);

  /// Each rank's sums from the last call to sum(), `[rank]`; empty with `fast` (the allreduce keeps
  /// only the totals).
  const std::vector<LogSums>& last_per_rank() const { return per_rank_; }

 private:
  LogSums sum_fast(const LogSums& local);
  LogSums sum_gathered(const LogSums& local);
  /// Starts `what` on this rank's group and waits for it; failures become hetseq::InputError.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const;

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::Device device_;
  bool fast_;
  int64_t rank_;
  int64_t world_size_;
  int64_t agreed_count_ = 0;       // fast: the number of names all ranks reported in the last call
  std::vector<LogSums> per_rank_;        // [rank]
};

}  // namespace hetseq
