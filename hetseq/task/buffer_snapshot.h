#pragma once
/// A copy of a model's buffers (a BatchNorm's running statistics and num_batches_tracked), to put back after
/// a pass that must leave no trace: the memory check's and the cap probe's trial passes, a stand-in pass of
/// --zero-sharding full (Note [Stand-in passes]).

#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace hetseq {

class BufferSnapshot {
 public:
  /// Copies every buffer of `model` (undefined ones stay undefined).
  explicit BufferSnapshot(torch::nn::Module& model);
  /// Writes the copies back into the model's buffers, in place.
  void restore();

 private:
  torch::nn::Module& model_;
  std::vector<torch::Tensor> copies_;  // [buffer]
};

}  // namespace hetseq
