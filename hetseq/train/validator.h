#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hetseq/data/data_plan.h"
#include "hetseq/data/dataset.h"
#include "hetseq/task/task.h"
#include "hetseq/channel/collective_channel.h"
#include "hetseq/train/precision.h"
#include "hetseq/observe/progress.h"

namespace hetseq {

/// How validation runs on one rank.
struct ValidatorOptions {
  torch::Device device = torch::kCPU;
  Precision precision = Precision::kFloat32;  // --fp16, --bf16: the forward passes' autocast
  int64_t num_workers = 1;                    // --num-workers: background threads that build batches
  /// --zero-sharding full: an empty batch runs a stand-in forward (the last batch again, its output
  /// dropped), so that every rank gathers the same units (Note [Sharded parameters]).
  bool stand_ins = false;
};

/// Loss and the task's metrics of a model on whole splits, each cut across ranks by the validation
/// plan (every sample once over all ranks) and summed over ranks by `channel` (null: one process). The training loop and
/// hetseq-eval both use it; it needs no optimizer.
class Validator {
 public:
  Validator(Task& task, std::shared_ptr<CollectiveChannel> channel, DataPlan plan, ValidatorOptions options);

  /// The plan of the next passes (every rank the same): the training loop hands it a balanced split's
  /// (PlanSchedule::valid_plan(epoch), Note [Validating a balanced split]). Throws hetseq::UsageError on a
  /// plan that does not hold together.
  void set_plan(DataPlan plan) {
    plan.validate();
    plan_ = std::move(plan);
  }
  /// The sums over all ranks of one pass over `dataset` (`sample_size` included).
  LogSums run(const std::shared_ptr<Dataset>& dataset, torch::nn::Module& model);
  /// The statistics of a pass from its sums, as logged: loss, nll_loss, ppl (in base 2, as fairseq),
  /// num_updates, and the task's derived metrics.
  std::vector<Stat> stats(const LogSums& sums, int64_t num_updates) const;

 private:
  Task& task_;
  std::shared_ptr<CollectiveChannel> channel_;
  DataPlan plan_;
  ValidatorOptions options_;
};

}  // namespace hetseq
