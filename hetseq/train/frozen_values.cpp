#include "hetseq/train/frozen_values.h"

#include "hetseq/core/format.h"

namespace hetseq {

// Note [Values frozen at capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CUDA graph replays its kernels with the arguments and the addresses they were captured with (Note [CUDA-graph
// updates]). Host numbers that reach a kernel as arguments are frozen at the capture: the sample size S that the
// gradients are divided by (Note [Weighted averaging]), from the task's host statistics, and the clip value
// (--clip-norm), compared with the norm on the device. So are the addresses the kernels read and write: the
// gradients (backward accumulates into them, the step reads them) and the parameters (the forward pass reads
// them); the graph's inputs are the Controller's own. A replay after one of them changed trains silently wrong: a
// divisor of another batch, gradients written where the step no longer reads. So the Controller keeps them as
// they were at the capture and takes them again before every replay; at the first difference it drops the graph,
// and that update and every later one train eagerly, after one line that names the value with both its values.
// What the host knows before a replay:
// - The task's sample size comes from its train_step, which a replay does not run. By the contract of static
//   shapes (TaskContext::static_shapes) it follows the batch: the shapes of its fields (a batch of another shape,
//   an epoch's short end, trains eagerly in between and is no change: Controller::fits_graph) and its sample
//   count. So before a replay the batch's sample count stands for it: a batch of the captured shape with another
//   count (one that a task padded to the shape) changes the sample size. Where the task does run on one shape
//   (the warm-ups, the capture) its sample size must be the one it gave that shape before: a task whose sample
//   size follows more than the batch's shape and count cannot be replayed, and trains eagerly.
// - The gradients come from the sharding strategy, zeroed in place and never freed (Note [Zeroing gradients]); a
//   program that frees or replaces them, or a parameter's storage, between updates is caught here; so is an
//   optimizer buffer or device scalar replaced (a restored optimizer state) where the graph holds the step (Note
//   [The step in a CUDA graph]). The step's own numbers (learning rate, count, epsilon) are not frozen there:
//   they are filled into device tensors before each replay.

std::optional<std::string> changed_value(const FrozenValues& frozen, const FrozenValues& now) {
  if (now.fields != frozen.fields) {
    return fmt::format("the batch's shape ({} at the capture, {} now)", frozen.fields, now.fields);
  }
  if (now.num_samples != frozen.num_samples) {
    return fmt::format("the sample size divisor, which follows the batch's sample count ({} at the capture, {} now)",
                       frozen.num_samples, now.num_samples);
  }
  if (now.sample_size != frozen.sample_size) {
    return fmt::format("the sample size divisor ({} at the capture, {} now)", frozen.sample_size, now.sample_size);
  }
  if (now.clip_norm != frozen.clip_norm) {
    return fmt::format("the clip value, --clip-norm ({} at the capture, {} now)", frozen.clip_norm, now.clip_norm);
  }
  auto moved = [](const char* what, const std::vector<const void*>& then,
                  const std::vector<const void*>& later) -> std::optional<std::string> {
    if (then.size() != later.size()) {
      return fmt::format("the number of {}s ({} at the capture, {} now)", what, then.size(), later.size());
    }
    for (size_t i = 0; i < then.size(); ++i) {
      if (then[i] != later[i]) {
        return fmt::format("the data pointer of {} {} of {} ({} at the capture, {} now)", what, i, then.size(),
                           fmt::ptr(then[i]), fmt::ptr(later[i]));
      }
    }
    return std::nullopt;
  };
  if (auto g = moved("gradient", frozen.gradients, now.gradients)) return g;
  if (auto p = moved("parameter", frozen.parameters, now.parameters)) return p;
  return moved("optimizer state tensor", frozen.optimizer_state, now.optimizer_state);
}

std::vector<const void*> data_pointers(const std::vector<torch::Tensor>& tensors) {
  std::vector<const void*> out;  // [tensor]
  out.reserve(tensors.size());
  for (const torch::Tensor& t : tensors) out.push_back(t.defined() ? t.const_data_ptr() : nullptr);
  return out;
}

std::string field_shapes(const Batch& batch) {
  std::vector<std::string> parts;  // [field] in name order
  for (const auto& [name, tensor] : batch.fields) {
    parts.push_back(fmt::format("{} {}[{}]", name, c10::toString(tensor.scalar_type()), fmt::join(tensor.sizes(), ", ")));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace hetseq
