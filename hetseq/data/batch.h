#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <torch/types.h>

namespace hetseq {

/// A batch of samples as a task's collate function builds it: named tensors whose first dimension is
/// the sample. `num_samples` is 0 for an empty batch (a rank with no samples left at the end of an
/// epoch takes part in the step with zero weight).
struct Batch {
  std::map<std::string, torch::Tensor> fields;  // [field name]
  int64_t num_samples = 0;

  /// The tensor stored under `name`; throws hetseq::InternalError when it is missing.
  const torch::Tensor& at(const std::string& name) const;
  bool empty() const { return num_samples == 0; }
  /// A copy with every tensor moved to `device` (non-blocking where the source is pinned).
  Batch to(const torch::Device& device) const;
};

}  // namespace hetseq
