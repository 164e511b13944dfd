#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "hetseq/optim/optimizer.h"

namespace hetseq {

/// PowerSGD's state between updates (--ddp-comm-hook powersgd), as a checkpoint keeps it: what
/// PowerSgd::gather_state gives and PowerSgd::load_state takes. See Note [PowerSGD in checkpoints]
/// (hetseq/reduce/powersgd_state.cpp).
struct PowerSgdState {
  /// One gradient bucket's state.
  struct Bucket {
    int64_t index = 0;                         // the bucket's index in the gradient reducer
    std::vector<std::vector<int64_t>> shapes;  // [view] the shapes of the bucket's gradients
    std::vector<int64_t> matrices;             // [compressed view] the view's position in the bucket
    std::vector<torch::Tensor> q;              // [compressed view] m x rank: the Q of the last update (every rank's)
    std::vector<torch::Tensor> errors;         // [compressed view] world_size x n x m: [rank] its error feedback
  };
  int64_t update = -1;          // PowerSgd::update(): the index of the last update it reduced
  int64_t world_size = 1;       // the ranks whose error feedback `errors` holds
  std::vector<Bucket> buckets;  // in index order; empty before compression started (warm-up)
};

/// What a Controller trains with, as one value (CPU copies): model, optimizer, loss scale, LR schedule,
/// update count, meters and random generator. A checkpoint stores it (see Checkpoint) together with
/// where the data stands; Controller::state() gives it and Controller::load_state() takes it back.
struct TrainingState {
  /// Parameters, then buffers, by module path (`conv1.weight`), on the CPU.
  std::vector<std::pair<std::string, torch::Tensor>> model;

  std::string optimizer_name;                                          // --optimizer
  std::map<std::string, double> optimizer_options;                     // its hyper-parameters (betas, eps, ...)
  std::optional<std::map<std::string, torch::Tensor>> optimizer_state;  // absent with --no-save-optimizer-state
  /// The per-parameter entries of optimizer_state when a sharded checkpoint keeps them in shard files
  /// (OptimizerShards), read on load by range; null otherwise. Controller::load_state reads it.
  std::shared_ptr<const optim::StateSource> optimizer_pieces;
  std::map<std::string, double> loss_scaler;                           // --fp16's DynamicLossScaler (else empty)
  std::string lr_scheduler_name;                                       // --lr-scheduler
  std::map<std::string, double> lr_scheduler_state;

  int64_t num_updates = 0;
  std::map<std::string, double> meters;  // see Controller::meter_state()
  torch::Tensor rng_state;               // the CPU generator's state
  /// [CUDA device] its default generator's state (rank 0's, as rng_state); empty without CUDA.
  /// See Note [Generator states in checkpoints].
  std::vector<torch::Tensor> cuda_rng_states;
  /// The gradient reducer's bucket layout (GradientReducer::bucket_layout), so that a resumed run
  /// reduces in the same order; empty for one process.
  std::vector<std::vector<int64_t>> bucket_layout;
  /// The gradient reducer's PowerSGD state, gathered from every rank when the checkpoint was written
  /// (GradientReducer::gather_comm_hook_state); absent without --ddp-comm-hook powersgd.
  std::optional<PowerSgdState> powersgd;
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

/// Copies `tensors` (from model_tensors) into `model`'s parameters and buffers. Throws
/// hetseq::InputError naming `source` (the file) on a missing or extra name or a shape mismatch, and
/// leaves the model unchanged then.
void load_model_tensors(torch::nn::Module& model, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::string& source);

/// The state of every visible CUDA device's default generator, [device] (CPU byte tensors); empty
/// where CUDA is not available. Compiles against a LibTorch without CUDA. The Controller calls it.
std::vector<torch::Tensor> cuda_rng_states();

/// Sets the default generators of the first min(states, devices) CUDA devices from `states`
/// (cuda_rng_states of another process); returns how many it set (0 without CUDA). Throws
/// hetseq::InputError naming `source` for a state that the generator refuses.
int64_t set_cuda_rng_states(const std::vector<torch::Tensor>& states, const std::string& source);

}  // namespace hetseq
