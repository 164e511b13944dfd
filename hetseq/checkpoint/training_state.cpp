#include "hetseq/checkpoint/training_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "hetseq/checkpoint/optimizer_overrides.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {

Checkpoint capture_checkpoint(Controller& controller, const CaptureContext& context) {
  Checkpoint c;
  c.model = model_tensors(controller.model());
  auto& optimizer = controller.optimizer();
  c.optimizer_name = optimizer.name();
  c.optimizer_options = optimizer.hyperparameters();
  if (context.with_optimizer_state) {
    std::map<std::string, torch::Tensor> state;
    // state() aliases the live buffers; the checkpoint keeps copies.
    for (const auto& [k, v] : optimizer.state()) state[k] = cpu_copy(v);
    c.optimizer_state = std::move(state);
  }
  if (const DynamicLossScaler* scaler = controller.loss_scaler()) c.loss_scaler = scaler->state();
  c.lr_scheduler_name = controller.lr_scheduler().name();
  c.lr_scheduler_state = controller.lr_scheduler().state();
  c.num_updates = controller.num_updates();
  c.epoch = context.next.epoch;
  c.offset = context.next.offset;
  c.meters = controller.meter_state();
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    c.rng_state = gen.get_state();
  }
  c.best = context.best;
  c.data_plan = context.data_plan;
  c.task = context.task;
  c.model_digest = context.model_digest;
  c.options = context.options;
  return c;
}

void check_checkpoint_fits(const Checkpoint& c, const std::string& task, const std::string& model_digest,
                           const std::string& source) {
  if (c.task != task) {
    throw InputError(fmt::format("{}: written by --task {}, but this run has --task {}; pass the right --task or "
                                 "another --restore-file",
                                 source, c.task, task));
  }
  if (c.model_digest != model_digest) {
    throw InputError(fmt::format("{}: its model has other parameters (names or shapes) than this run's model; check "
                                 "the model flags, or pass another --restore-file",
                                 source));
  }
}

IteratorPosition restore_checkpoint(Controller& controller, const Checkpoint& c, const ResumeOptions& options,
                                    const std::string& source) {
  auto& optimizer = controller.optimizer();
  if (!options.reset_optimizer) {
    if (c.optimizer_name != optimizer.name()) {
      throw InputError(fmt::format("{}: saved with --optimizer {}, but this run has --optimizer {}; pass "
                                   "--reset-optimizer to start the new optimizer afresh",
                                   source, c.optimizer_name, optimizer.name()));
    }
    // The saved hyper-parameters win over the command line, so that a resumed run continues the same
    // run; --optimizer-overrides changes them on purpose.
    const std::map<std::string, double> given = optimizer.hyperparameters();
    for (const auto& [name, value] : c.optimizer_options) {
      if (auto it = given.find(name); it != given.end() && it->second != value) {
        log::warn("[checkpoint] {}: optimizer {} is {} in the checkpoint and {} on the command line; using the "
                  "checkpoint's (change it with --optimizer-overrides {}=VALUE)",
                  source, name, value, it->second, name);
      }
      optimizer.set_hyperparameter(name, value);
    }
    if (c.optimizer_state) {
      optimizer.load_state(*c.optimizer_state);
    } else {
      log::warn("[checkpoint] {} has no optimizer state (saved with --no-save-optimizer-state): the optimizer "
                "starts afresh",
                source);
    }
    if (DynamicLossScaler* scaler = controller.loss_scaler()) {
      if (!c.loss_scaler.empty()) {
        scaler->load_state(c.loss_scaler, source);
        log::info("[fp16] loss scale {} from {}", scaler->scale(), source);
      } else {
        log::info("[fp16] {} was saved without --fp16: the loss scale starts at {}", source, scaler->scale());
      }
    }
  }
  apply_optimizer_overrides(optimizer, options.optimizer_overrides);

  if (!options.reset_lr_scheduler) {
    if (c.lr_scheduler_name != controller.lr_scheduler().name()) {
      throw InputError(fmt::format("{}: saved with --lr-scheduler {}, but this run has --lr-scheduler {}; pass "
                                   "--reset-lr-scheduler to start the new schedule afresh",
                                   source, c.lr_scheduler_name, controller.lr_scheduler().name()));
    }
    controller.lr_scheduler().load_state(c.lr_scheduler_state);
  }
  controller.set_num_updates(c.num_updates);
  if (!options.reset_meters) controller.load_meter_state(c.meters);
  if (c.rng_state.defined()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(c.rng_state);
  }
  if (options.reset_dataloader) return IteratorPosition{1, 0};
  return IteratorPosition{c.epoch, c.offset};
}

}  // namespace hetseq
