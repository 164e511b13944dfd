// The Controller's state as one value (Controller::state() and Controller::load_state()), and its meters.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/optim/optimizer_overrides.h"
#include "hetseq/train/controller.h"
#include "hetseq/train/controller_detail.h"

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
  s.model = sharding_->model_tensors(*model_);  // under full, what collect_model gathered
  s.optimizer_name = sharding_->optimizer().name();
  s.optimizer_options = sharding_->optimizer().hyperparameters();
  if (with_optimizer_state) {
    std::map<std::string, torch::Tensor> state;
    // state() aliases the live buffers; the snapshot keeps copies.
    for (const auto& [k, v] : sharding_->optimizer().state()) state[k] = cpu_copy(v);
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
  s.bucket_layout = sharding_->reducer().bucket_layout();
  return s;
}

void Controller::load_optimizer_state(const TrainingState& s, const std::string& source) {
  if (s.optimizer_name != sharding_->optimizer().name()) {
    throw InputError(fmt::format("{}: saved with --optimizer {}, but this run has --optimizer {}; pass "
                                 "--reset-optimizer to start the new optimizer afresh",
                                 source, s.optimizer_name, sharding_->optimizer().name()));
  }
  // The saved hyper-parameters win over the command line, so that a resumed run continues the same
  // run; --optimizer-overrides changes them on purpose.
  const std::map<std::string, double> given = sharding_->optimizer().hyperparameters();
  for (const auto& [name, value] : s.optimizer_options) {
    if (auto it = given.find(name); it != given.end() && it->second != value) {
      log::warn("[checkpoint] {}: optimizer {} is {} in the checkpoint and {} on the command line; using the "
                "checkpoint's (change it with --optimizer-overrides {}=VALUE)",
                source, name, value, it->second, name);
    }
    sharding_->optimizer().set_hyperparameter(name, value);
  }
  if (s.optimizer_state && s.optimizer_pieces) {
    sharding_->load_state(*s.optimizer_state, *s.optimizer_pieces);  // a sharded checkpoint, re-cut
  } else if (s.optimizer_state) {
    sharding_->optimizer().load_state(*s.optimizer_state);
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
  apply_optimizer_overrides(sharding_->optimizer(), options.optimizer_overrides);
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
  if (!sharding_->reducer().load_comm_hook_state(s.powersgd, source) && s.powersgd) {
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

void Controller::update_meters(const UpdateResult& result) {
  const double sample_size = sum_or(result.sums, "sample_size");
  const double ntokens = sum_or(result.sums, "ntokens", sample_size);
  const double nsentences = sum_or(result.sums, "nsentences", sample_size);
  meters_.loss.update(sum_or(result.sums, "loss") / sample_size / kLn2, sample_size);
  meters_.nll_loss.update(sum_or(result.sums, "nll_loss", sum_or(result.sums, "loss")) / ntokens / kLn2, ntokens);
  meters_.wpb.update(ntokens);
  meters_.bsz.update(nsentences);
  meters_.wps.update(ntokens);
  meters_.ups.update(1);
  meters_.gnorm.update(result.gnorm);
  meters_.clip.update(result.clipped ? 1 : 0);
  detail::add_into(epoch_sums_, result.sums);
}

double Controller::lr_step(int64_t epoch, std::optional<double> val_loss) {
  lr_scheduler_->step(epoch, val_loss);
  return lr_scheduler_->step_update(num_updates_);
}

void Controller::set_num_updates(int64_t n) {
  num_updates_ = n;
  lr_scheduler_->step_update(n);
}

std::map<std::string, double> Controller::meter_state() {
  read_late_update();
  std::map<std::string, double> out = meters_.state();
  for (const auto& [k, v] : epoch_sums_) out["epoch_sums." + k] = v;
  return out;
}

void Controller::load_meter_state(const std::map<std::string, double>& state) {
  meters_.load_state(state);
  epoch_sums_.clear();
  const std::string prefix = "epoch_sums.";
  for (const auto& [k, v] : state) {
    if (k.rfind(prefix, 0) == 0) epoch_sums_[k.substr(prefix.size())] = v;
  }
}

void Controller::reset_epoch_meters() {
  read_late_update();
  meters_.reset_epoch();
  epoch_sums_.clear();
}

std::vector<Stat> Controller::train_stats() {
  read_late_update();
  std::vector<Stat> stats;
  const double nll = meters_.nll_loss.avg();
  stats.push_back({"loss", meters_.loss.avg()});
  stats.push_back({"nll_loss", nll});
  stats.push_back({"ppl", std::pow(2.0, nll)});
  stats.push_back({"wps", std::round(meters_.wps.rate()), true});
  stats.push_back({"ups", meters_.ups.rate()});
  stats.push_back({"wpb", std::round(meters_.wpb.avg()), true});
  stats.push_back({"bsz", std::round(meters_.bsz.avg()), true});
  stats.push_back({"num_updates", static_cast<double>(num_updates_), true});
  stats.push_back({"lr", sharding_->optimizer().lr()});
  stats.push_back({"gnorm", meters_.gnorm.avg()});
  stats.push_back({"clip", meters_.clip.avg()});
  if (scaler_) stats.push_back({"loss_scale", scaler_->scale()});
  stats.push_back({"train_wall", std::round(meters_.train_wall.sum_s()), true});
  stats.push_back({"wall", std::round(meters_.wall.elapsed_s()), true});
  for (const auto& [name, value] : task_.derived_metrics(epoch_sums_)) stats.push_back({name, value});
  return stats;
}

}  // namespace hetseq
