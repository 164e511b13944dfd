#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <torch/types.h>

namespace hetseq {

/// A batch of samples as a task's collate function builds it: named tensors, most of them with the
/// sample as their first dimension (a task may add batch-level ones, such as BERT's flat masked
/// positions). `num_samples` is 0 for an empty batch (a rank with no samples left at the end of an epoch
/// takes part in the step with zero weight).
struct Batch {
  std::map<std::string, torch::Tensor> fields;  // [field name]
  int64_t num_samples = 0;

  /// The tensor stored under `name`; throws hetseq::InternalError when it is missing.
  const torch::Tensor& at(const std::string& name) const;
  bool empty() const { return num_samples == 0; }
  /// Whether every tensor that holds data is in pinned (page-locked) host memory; false when none does.
  bool pinned() const;
  /// A copy with every tensor in pinned host memory, for an asynchronous copy to a CUDA device. Needs
  /// CUDA at run time (the BatchLoader pins only for a CUDA rank). See Note [Batches to the device].
  Batch pin_memory() const;
  /// A copy with every tensor moved to `device`; tensors already there are shared, not copied. A pinned
  /// batch goes to a CUDA device on a side stream, which the current stream waits for; otherwise the
  /// copy runs on the current stream. See Note [Batches to the device].
  Batch to(const torch::Device& device) const;
};

}  // namespace hetseq
