#pragma once
/// The MNIST classifier of HetSeq (`MNISTNet`): two convolutions, max-pooling, two fully connected layers.

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "hetseq/task/model_units.h"

namespace hetseq::mnist {

/// Dropout probabilities of MnistNet (`--dropout p1,p2`), each in [0, 1).
struct MnistNetOptions {
  double dropout1 = 0.25;  // feature dropout (whole channels) after the convolutions
  double dropout2 = 0.5;   // dropout after the first fully connected layer
  int64_t hidden = 128;    // width of the hidden fully connected layer (--hidden-units; HetSeq's is 128)
};

/// conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, Dropout2d(dropout1), flatten, fc 9216->128, ReLU,
/// Dropout(dropout2), fc 128->10, log_softmax. Submodules are named as in HetSeq (`conv1`, `conv2`, `dropout1`,
/// `dropout2`, `fc1`, `fc2`), so parameter names match its checkpoints.
class MnistNetImpl : public torch::nn::Module, public ShardableModel {
 public:
  explicit MnistNetImpl(const MnistNetOptions& options = {});

  /// Maps images float [N, 1, 28, 28] to log-probabilities float [N, 10] over the ten classes.
  torch::Tensor forward(const torch::Tensor& images);

  const MnistNetOptions& options() const { return options_; }

  /// conv1, conv2, fc1, fc2: every parameter is in a unit (--zero-sharding full, Note [Sharded parameters]).
  std::vector<std::shared_ptr<torch::nn::Module>> units() override;
  void set_unit_runner(std::shared_ptr<UnitRunner> runner) override { runner_ = std::move(runner); }

 private:
  MnistNetOptions options_;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::Dropout2d dropout1_{nullptr};
  torch::nn::Dropout dropout2_{nullptr};
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
  std::shared_ptr<UnitRunner> runner_;
};

/// The module holder of MnistNetImpl (`MnistNet net; net->forward(x)`).
TORCH_MODULE(MnistNet);

}  // namespace hetseq::mnist
