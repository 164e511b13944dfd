#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace hetseq {

/// What a Controller trains with, as one value (CPU copies): model, optimizer, loss scale, LR schedule,
/// update count, meters and random generator. A checkpoint stores it (see Checkpoint) together with
/// where the data stands; Controller::state() gives it and Controller::load_state() takes it back.
struct TrainingState {
  /// Parameters, then buffers, by module path (`conv1.weight`), on the CPU.
  std::vector<std::pair<std::string, torch::Tensor>> model;

  std::string optimizer_name;                                          // --optimizer
  std::map<std::string, double> optimizer_options;                     // its hyper-parameters (betas, eps, ...)
  std::optional<std::map<std::string, torch::Tensor>> optimizer_state;  // absent with --no-save-optimizer-state
  std::map<std::string, double> loss_scaler;                           // --fp16's DynamicLossScaler (else empty)
  std::string lr_scheduler_name;                                       // --lr-scheduler
  std::map<std::string, double> lr_scheduler_state;

  int64_t num_updates = 0;
  std::map<std::string, double> meters;  // see Controller::meter_state()
  torch::Tensor rng_state;               // the CPU generator's state
  /// The gradient reducer's bucket layout (GradientReducer::bucket_layout), so that a resumed run
  /// reduces in the same order; empty for one process.
  std::vector<std::vector<int64_t>> bucket_layout;
};

/// What to take from a saved TrainingState on resume (the --reset-* flags and --optimizer-overrides).
struct ResumeOptions {
  bool reset_lr_scheduler = false;
  bool reset_meters = false;
  bool reset_optimizer = false;
  std::vector<std::pair<std::string, double>> optimizer_overrides;
};

/// A copy of `t` on the CPU, detached (one copy, also for CPU tensors): what a state keeps of live
/// tensors that the next update changes.
torch::Tensor cpu_copy(const torch::Tensor& t);

/// The parameters and buffers of `model` as a TrainingState holds them (CPU copies).
std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model);

}  // namespace hetseq
