#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "hetseq/data/batch.h"
#include "hetseq/data/dataset.h"
#include "hetseq/task/metric.h"

namespace hetseq {

/// Sums that a step computed on its device (losses, correct counts), as 0-dim tensors: reading them
/// with .item() would make every micro-batch wait for the device. The Controller adds them up on the
/// device and reads them on the host once per update. See Note [Statistics on the device].
using LogTensors = std::map<std::string, torch::Tensor>;

/// Adds each tensor of `from` into `into` as float64 on its device, without waiting for the device.
void add_log_tensors(LogTensors& into, const LogTensors& from);

/// Reads `tensors` on the host with one copy and adds them into `sums`. Returns whether it copied
/// (false when `tensors` is empty).
bool add_to_host(LogSums& sums, const LogTensors& tensors);

/// ln 2: losses are summed in nats and logged in bits (base 2), as fairseq logs them.
inline constexpr double kLn2 = 0.69314718055994530942;

/// What a train or valid step returns.
struct StepOutput {
  /// The loss summed (not averaged) over the batch's samples: a scalar tensor. The Controller divides
  /// the gradient by the total sample size of the update. See Note [Weighted averaging].
  torch::Tensor loss;
  /// The count the loss is a sum over (samples, sentences or tokens, as the task documents).
  double sample_size = 0;
  /// Sums known on the host without the device (counts from the batch), by metric name (see add).
  LogSums log;
  /// Sums computed on the device (see LogTensors), by metric name (see add). A name is in `log` or here,
  /// not in both. A task that reports no `loss` of its own has `loss` itself logged (see
  /// logged_tensors); `nsentences` and `ntokens` default to `sample_size`.
  LogTensors log_tensors;

  /// Adds `value`, a 0-dim tensor the step computed on its device (a correct count, a partial loss), to
  /// the step's sum of `metric` (log_tensors), without waiting for the device. Throws
  /// hetseq::InternalError naming the metric for kSampleSize (set sample_size), for a metric already
  /// added as a host count, and for a tensor that is not a scalar.
  void add(const Metric& metric, const torch::Tensor& value);
  /// Adds `value`, a count the host knows from the batch (sentences, tokens), to the step's sum of
  /// `metric` (log). Throws as above, for a metric already added as a tensor.
  void add(const Metric& metric, double value);
};

/// What the Controller and the Validator add up for `step`: its log_tensors, plus `loss` (the step's
/// loss, detached) when the task put no `loss` in `log` or `log_tensors`.
LogTensors logged_tensors(const StepOutput& step);

/// All of a step's sums on the host (`log` and `log_tensors`, read with one copy, and `sample_size`), as
/// the Controller sums them, for tests and tools that look at one step.
LogSums host_log(const StepOutput& step);

/// Where a task's model and batches live.
struct TaskContext {
  torch::Device device = torch::kCPU;
  uint64_t seed = 1;
  /// The training step is replayed from a CUDA graph (--cuda-graph): a task that can should give every
  /// full batch the same fields and shapes (BERT pads its masked positions to a fixed count).
  bool static_shapes = false;
};

/// A kind of training job: builds the model, loads splits, computes the loss. A task lives in its own
/// folder under `tasks/` and registers itself by name (see task/task_registry.h); the library never
/// names a task.
class Task {
 public:
  virtual ~Task() = default;

  /// Builds a freshly initialised model (on the CPU; the caller moves it to the device).
  virtual std::shared_ptr<torch::nn::Module> build_model() = 0;

  /// Loads the split `name` (`train`, `test`, ...). Throws hetseq::InputError naming the file when the
  /// data is missing or corrupt.
  virtual std::shared_ptr<Dataset> load_dataset(const std::string& split) = 0;

  /// Forward pass and loss on one batch (already on the task's device). `model` is what build_model
  /// returned. Must not call backward. The Controller and the Validator never pass an empty batch to
  /// it (they run empty micro-batches themselves and skip empty validation batches; see Note [Empty
  /// micro-batches]), but a Dataset's collate may be asked for an empty batch at an epoch's uneven end.
  virtual StepOutput compute_loss(torch::nn::Module& model, const Batch& batch) = 0;

  /// The backward pass of a train step, as the Controller runs it: it scales `step.loss` (--fp16, see
  /// Note [Loss scaling]), starts summing the statistics over the ranks (Note [Stat sync]), lets the
  /// gradient reducer arm its hooks, and differentiates. A task that overrides train_step calls it
  /// once per step, instead of loss.backward(), with its StepOutput complete: the log and sample_size
  /// it passes are what it must return (the statistics travel during backward, so they cannot change
  /// after it).
  using Backward = std::function<void(const StepOutput& step)>;

  /// Forward, loss and backward. The default calls compute_loss, then `backward` on its output (plain
  /// loss.backward() when `backward` is empty). `batch` is never empty: for a rank with no samples
  /// left at the end of an epoch the Controller itself runs a zero loss over every parameter through
  /// `backward`, without calling the task (see Note [Empty micro-batches]).
  virtual StepOutput train_step(torch::nn::Module& model, const Batch& batch, const Backward& backward = nullptr);

  /// Loss without gradients. The default calls compute_loss under torch::NoGradGuard.
  virtual StepOutput valid_step(torch::nn::Module& model, const Batch& batch);

  /// The metrics this task derives as ratios of its sums (accuracy, a loss per sentence), logged beside
  /// `loss` for every --log-interval, epoch and validation. The default has none.
  virtual std::vector<Ratio> ratios() const;

  /// Metrics derived from the reduced sums, by name, added to what is logged. The default evaluates
  /// ratios(); a task that derives something else overrides it (and adds evaluate(ratios(), sums) if it
  /// declares ratios too).
  virtual std::map<std::string, double> derived_metrics(const MetricSums& sums) const;
};

}  // namespace hetseq
