// The stand-in passes of --zero-sharding full: a rank without samples for a pass runs one anyway, so that every
// rank gathers the same units in the same order (Note [Sharded parameters]).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "hetseq/checkpoint/training_state.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/train/controller.h"
#include "hetseq/train/precision.h"

namespace hetseq {

std::vector<Batch> Controller::padded_for_stand_ins(const std::vector<Batch>& micro_batches) {
  for (const Batch& b : micro_batches) {
    if (!b.empty()) {
      stand_in_ = b;
      break;
    }
  }
  const auto mine = static_cast<int64_t>(micro_batches.size());
  const int64_t passes = sharding_->passes(mine);
  // In front, so that every rank's last pass is the one whose backward the reducer watches.
  std::vector<Batch> padded(static_cast<size_t>(passes - mine));
  padded.insert(padded.end(), micro_batches.begin(), micro_batches.end());
  return padded;
}

void Controller::stand_in_pass(const Task::Backward& backward) {
  if (stand_in_.empty()) {
    throw InputError(fmt::format(
        "rank {} of {}: --zero-sharding full: this rank has had no samples yet, so no batch to run in place of an "
        "empty micro-batch (every rank runs every pass, to gather the same parameters); give it samples in the first "
        "update (more data, or smaller --max-sentences on the other ranks)",
        channel_->rank(), channel_->world_size()));
  }
  auto generator = at::detail::getDefaultCPUGenerator();
  at::Tensor cpu_state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    cpu_state = generator.get_state();
  }
  const std::vector<torch::Tensor> cuda_states = cuda_rng_states();
  {
    const AutocastGuard autocast(options_.device, options_.precision);
    task_.train_step(*model_, stand_in_.to(options_.device), [&](const StepOutput& step) {
      StepOutput zero;
      zero.loss = step.loss * 0;
      backward(zero);
    });
  }
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(cpu_state);
  }
  if (!cuda_states.empty()) set_cuda_rng_states(cuda_states, "the stand-in pass");
}

}  // namespace hetseq
