// The Controller's state as one value: Controller::state() and Controller::load_state().
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/optim/optimizer_overrides.h"
#include "hetseq/train/controller.h"

namespace hetseq {

// Note [Generator states in checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint keeps the state of the CPU generator and, where CUDA is available, of every visible
// CUDA device's default generator ([device]), as rank 0 had them after the update it saved; every rank
// restores them on resume. Within an update they matter little: train_update reseeds the CPU generator
// and every CUDA generator (at::manual_seed seeds all devices of the accelerator) from (seed, update,
// rank), so that dropout, on the CPU or a GPU, draws what the uninterrupted run drew whatever came
// before. What the saved states carry is what is drawn outside an update, between the last update and
// the next (a task's or user's code between updates, a sampled validation): after a resume it draws
// what it would have drawn without the stop. A process that sees fewer or more CUDA devices than the
// one that saved restores the devices both have, and says so; a file without CUDA states (saved by a
// rank 0 without CUDA, or by an earlier hetseq) leaves the CUDA generators as they are, also said.

TrainingState Controller::state(bool with_optimizer_state) {
  read_late_update();  // a diverged last update throws here, before anything is saved
  TrainingState s;
  s.model = model_tensors(*model_);
  s.optimizer_name = optimizer_->name();
  s.optimizer_options = optimizer_->hyperparameters();
  if (with_optimizer_state) {
    std::map<std::string, torch::Tensor> state;
    // state() aliases the live buffers; the snapshot keeps copies.
    for (const auto& [k, v] : optimizer_->state()) state[k] = cpu_copy(v);
    s.optimizer_state = std::move(state);
  }
  if (scaler_) s.loss_scaler = scaler_->state();
  s.lr_scheduler_name = lr_scheduler_->name();
  s.lr_scheduler_state = lr_scheduler_->state();
  s.num_updates = num_updates_;
  s.meters = meter_state();
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  s.rng_state = gen.get_state();
  s.cuda_rng_states = cuda_rng_states();
  s.bucket_layout = reducer_->bucket_layout();
  return s;
}

void Controller::load_optimizer_state(const TrainingState& s, const std::string& source) {
  if (s.optimizer_name != optimizer_->name()) {
    throw InputError(fmt::format("{}: saved with --optimizer {}, but this run has --optimizer {}; pass "
                                 "--reset-optimizer to start the new optimizer afresh",
                                 source, s.optimizer_name, optimizer_->name()));
  }
  // The saved hyper-parameters win over the command line, so that a resumed run continues the same
  // run; --optimizer-overrides changes them on purpose.
  const std::map<std::string, double> given = optimizer_->hyperparameters();
  for (const auto& [name, value] : s.optimizer_options) {
    if (auto it = given.find(name); it != given.end() && it->second != value) {
      log::warn("[checkpoint] {}: optimizer {} is {} in the checkpoint and {} on the command line; using the "
                "checkpoint's (change it with --optimizer-overrides {}=VALUE)",
                source, name, value, it->second, name);
    }
    optimizer_->set_hyperparameter(name, value);
  }
  if (s.optimizer_state && s.optimizer_pieces) {
    optimizer_->load_state(*s.optimizer_state, *s.optimizer_pieces);  // a sharded checkpoint, re-cut
  } else if (s.optimizer_state) {
    optimizer_->load_state(*s.optimizer_state);
  } else {
    log::warn("[checkpoint] {} has no optimizer state (saved with --no-save-optimizer-state): the optimizer "
              "starts afresh",
              source);
  }
  if (!scaler_) return;
  if (!s.loss_scaler.empty()) {
    scaler_->load_state(s.loss_scaler, source);
    log::info("[fp16] loss scale {} from {}", scaler_->scale(), source);
  } else {
    log::info("[fp16] {} was saved without --fp16: the loss scale starts at {}", source, scaler_->scale());
  }
}

void Controller::load_state(const TrainingState& s, const ResumeOptions& options, const std::string& source) {
  if (!options.reset_optimizer) load_optimizer_state(s, source);
  apply_optimizer_overrides(*optimizer_, options.optimizer_overrides);
  if (!options.reset_lr_scheduler) {
    if (s.lr_scheduler_name != lr_scheduler_->name()) {
      throw InputError(fmt::format("{}: saved with --lr-scheduler {}, but this run has --lr-scheduler {}; pass "
                                   "--reset-lr-scheduler to start the new schedule afresh",
                                   source, s.lr_scheduler_name, lr_scheduler_->name()));
    }
    lr_scheduler_->load_state(s.lr_scheduler_state);
  }
  set_num_updates(s.num_updates);
  if (!options.reset_meters) load_meter_state(s.meters);
  if (s.rng_state.defined()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(s.rng_state);
  }
  load_cuda_rng_states(s.cuda_rng_states, source);
  if (!reducer_->load_comm_hook_state(s.powersgd, source) && s.powersgd) {
    log::info("[checkpoint] {} holds PowerSGD state, which this run does not use (no --ddp-comm-hook powersgd)",
              source);
  }
}

// See Note [Generator states in checkpoints].
void Controller::load_cuda_rng_states(const std::vector<torch::Tensor>& states, const std::string& source) {
  const auto devices = static_cast<int64_t>(torch::cuda::device_count());
  if (devices == 0) return;
  if (states.empty()) {
    log::info("[checkpoint] {} holds no CUDA generator state (saved by a rank 0 without CUDA, or by an earlier "
              "hetseq): the {} CUDA generator(s) keep their seeds",
              source, devices);
    return;
  }
  const int64_t set = set_cuda_rng_states(states, source);
  if (set != static_cast<int64_t>(states.size()) || set != devices) {
    log::info("[checkpoint] {} holds the generator states of {} CUDA device(s) and this process sees {}: restored "
              "those of the first {}",
              source, states.size(), devices, set);
  }
}

}  // namespace hetseq
