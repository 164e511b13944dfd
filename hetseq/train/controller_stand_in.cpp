// The stand-in passes of --zero-sharding full: a rank without samples for a pass runs one anyway, so that every
// rank gathers the same units in the same order (Note [Sharded parameters]).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "hetseq/checkpoint/training_state.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/task/buffer_snapshot.h"
#include "hetseq/train/controller.h"
#include "hetseq/train/precision.h"

namespace hetseq {

// Note [Stand-in passes]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Under --zero-sharding full every rank runs every pass of an update, so that the units' gathers meet (Note
// [Sharded parameters]); a rank without samples for a pass runs a stand-in: a forward and backward whose loss
// is multiplied by 0. What it runs and what it leaves behind:
// - the batch is samples 0 and 1 of the training data (0 alone in a dataset of one), collated once. Every rank can make it at any point of any run,
//   from the dataset alone: a resumed run whose first update finds a rank without samples (an epoch's short
//   end, a smaller --update-freq) has it as much as a run that trained before. (The last batch the rank
//   trained, used before, was missing exactly there: a resume just before an epoch's short end could not start.)
// - the gradients: zero loss, zero gradient; x + 0 is x, so the sums are unchanged, bit for bit.
// - the model's buffers (a BatchNorm's running statistics and num_batches_tracked) are copied before the
//   pass and written back after it, and every random generator (the CPU's, each CUDA device's) is restored:
//   the run goes on as if the pass had not happened, as under --zero-sharding none, where an empty
//   micro-batch runs nothing of the task.

std::vector<Batch> Controller::padded_for_stand_ins(const std::vector<Batch>& micro_batches) {
  const auto mine = static_cast<int64_t>(micro_batches.size());
  const int64_t passes = sharding_->passes(mine);
  // In front, so that every rank's last pass is the one whose backward the reducer watches.
  std::vector<Batch> padded(static_cast<size_t>(passes - mine));
  padded.insert(padded.end(), micro_batches.begin(), micro_batches.end());
  return padded;
}

void Controller::stand_in_pass(const Task::Backward& backward) {
  if (stand_in_.empty()) {
    HETSEQ_ASSERT(stand_in_data_ && stand_in_data_->size() > 0,
                  "rank {} of {}: a stand-in pass without training data to take its batch from (set_stand_in_data)",
                  channel_->rank(), channel_->world_size());
    // Two samples where there are: a BatchNorm over a batch of one has no variance to train with.
    stand_in_ = stand_in_data_->size() > 1 ? stand_in_data_->collate({0, 1}) : stand_in_data_->collate({0});
  }
  BufferSnapshot buffers(*model_);
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
  buffers.restore();
}

}  // namespace hetseq
