#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "hetseq/data/batch.h"

namespace hetseq {

/// The host's values that a captured update holds as they were at its capture, which every replay must find
/// unchanged (Note [Values frozen at capture]). The Controller takes them at the capture and before each replay.
struct FrozenValues {
  std::string fields;       // field_shapes of the batch: the graph's inputs
  int64_t num_samples = 0;  // the batch's samples, which the task's sample size follows for batches of one shape
  double sample_size = 0;   // the task's sample size: the gradients' divisor (Note [Weighted averaging])
  double clip_norm = 0;     // --clip-norm, compared with the norm on the device
  std::vector<const void*> gradients;   // [gradient] data pointers: backward accumulates there, the step reads them
  std::vector<const void*> parameters;  // [parameter] data pointers: the forward pass reads them
  /// [tensor] data pointers of the optimizer's step_tensors() (its buffers, its device scalars), where the graph
  /// holds the step; empty otherwise.
  std::vector<const void*> optimizer_state;
};

/// The first value of `now` that is not `frozen`'s, in words that name it and give both values ("the sample
/// size (8 at the capture, 6 now)"); nothing when every value is the same.
std::optional<std::string> changed_value(const FrozenValues& frozen, const FrozenValues& now);

/// The data pointers of `tensors`, [tensor]: null for an undefined one.
std::vector<const void*> data_pointers(const std::vector<torch::Tensor>& tensors);

/// A batch's fields as one line, each its name, dtype and sizes ("x Float[8, 4], y Float[8, 1]"): batches of one
/// shape have the same line.
std::string field_shapes(const Batch& batch);

}  // namespace hetseq
