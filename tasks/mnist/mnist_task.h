#pragma once
/// The `mnist` task: HetSeq's MNIST classifier on MNIST or Fashion-MNIST IDX files (`--task mnist`).

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hetseq/task/task.h"
#include "tasks/mnist/mnist_dataset.h"
#include "tasks/mnist/mnist_model.h"

namespace hetseq::mnist {

/// What the mnist task is built from (the task factory fills it from the command line).
struct MnistTaskOptions {
  std::string data_dir;   // --data: the directory with the IDX files
  MnistNetOptions model;  // --dropout
};

/// Parses `--dropout`: exactly two comma-separated probabilities in [0, 1), e.g. `0.25,0.5` or `(0.25, 0.5)`.
/// Throws hetseq::UsageError naming --dropout otherwise.
MnistNetOptions parse_dropout(const std::string& text);

/// The splits the task knows, in order: `train` (files `train-*`) and `test` (files `t10k-*`).
const std::vector<std::string>& mnist_split_names();

/// The IDX files of `split` in `data_dir`, each `<prefix>-images-idx3-ubyte` or the same with `.gz` (the plain
/// file wins when both exist). Throws hetseq::UsageError listing the splits when `split` is unknown, and
/// hetseq::InputError naming --data, the directory and the file looked for when a file is missing.
MnistFiles find_split_files(const std::string& data_dir, const std::string& split);

/// The correct predictions of a step (summed on the device).
inline constexpr Metric kCorrect{"ncorrect"};

/// The task. Batches hold `input` float [n, 1, 28, 28] and `target` int64 [n]; the loss is the summed negative
/// log-likelihood over the n samples (sample_size = n, which `nsentences` and `ntokens` default to). Logs
/// `loss` (= `nll_loss`) and kCorrect; derives `accuracy` (percent).
class MnistTask : public Task {
 public:
  /// Checks that `options.data_dir` is a directory; throws hetseq::UsageError for an empty --data and
  /// hetseq::InputError naming --data and the path otherwise.
  explicit MnistTask(MnistTaskOptions options);

  /// A fresh MnistNet (its MnistNetImpl), initialised from torch's global generator (the driver seeds it).
  std::shared_ptr<torch::nn::Module> build_model() override;

  /// Loads `train` or `test` (see find_split_files), normalised with the train split's pixel statistics.
  std::shared_ptr<Dataset> load_dataset(const std::string& split) override;

  /// `model` must be an MnistNetImpl; `batch` is never empty (see Task::compute_loss). The loss is summed over
  /// the batch, `loss`, `nll_loss` and `ncorrect` stay on the device.
  StepOutput compute_loss(torch::nn::Module& model, const Batch& batch) override;

  /// `accuracy` = 100 * ncorrect / nsentences, when nsentences > 0.
  std::vector<Ratio> ratios() const override;

  /// The mean and standard deviation of the train split's pixels (in [0, 1]); reads the train images on the
  /// first call unless load_dataset("train") already did. Safe to call from several threads.
  PixelStats pixel_stats();

  const MnistTaskOptions& options() const { return options_; }

 private:
  MnistTaskOptions options_;
  std::mutex stats_mutex_;
  std::optional<PixelStats> stats_;  // guarded by stats_mutex_
};

}  // namespace hetseq::mnist
