#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <torch/nn/module.h>

#include "hetseq/optim/lr_scheduler.h"
#include "hetseq/optim/optimizer.h"
#include "hetseq/task/task.h"
#include "hetseq/observe/tracer.h"
#include "hetseq/distributed/collective_channel.h"
#include "hetseq/distributed/gradient_reducer.h"
#include "hetseq/train/loss_scaler.h"
#include "hetseq/train/meters.h"
#include "hetseq/train/precision.h"
#include "hetseq/observe/progress.h"
#include "hetseq/checkpoint/training_state.h"

namespace hetseq {

/// What the Controller needs from the command line.
struct ControllerOptions {
  double clip_norm = 25;  // --clip-norm: largest gradient norm; 0 turns clipping off
  uint64_t seed = 1;      // --seed: with the update count and rank, seeds dropout for each update
  int64_t rank = 0;
  torch::Device device = torch::kCPU;
  Precision precision = Precision::kFloat32;  // --fp16, --bf16: the forward passes' autocast
  /// Dynamic loss scaling (set with --fp16; allowed with any precision). See Note [Loss scaling].
  std::optional<LossScalerOptions> loss_scaling;
};

/// What one update did, after reduction over all ranks.
struct UpdateResult {
  LogSums sums;         // summed over micro-batches and ranks
  double gnorm = 0;     // gradient norm before clipping (inf or NaN when the update overflowed)
  bool clipped = false;
  /// The gradients overflowed under loss scaling: no step was taken, the update count did not move,
  /// and the loss scale went down. Every rank gets the same answer. See Note [Loss scaling].
  bool skipped = false;
  double loss_scale = 1;  // the scale this update's loss was multiplied by
  /// Times the update read values from the device on the host: the statistics (once, however many
  /// micro-batches) and the gradient norm. See Note [Statistics on the device].
  int64_t host_reads = 0;
  /// Some rank voted to stop the run after this update; the same on every rank (Note [Clean stops]).
  bool stop_agreed = false;
  /// Statistics collectives waited for after backward: 0 in the steady state (Note [Stat sync]).
  int64_t late_stat_rounds = 0;
  /// How the gradients travelled: buckets, bytes, times (zeros for one process).
  ReductionTiming reduction;
};

/// Runs updates: accumulates the gradients of an update's micro-batches, has the GradientReducer
/// sum them over the ranks and the CollectiveChannel the statistics and stop votes (Note
/// [Communication roles]), normalises by the total sample size (see Note [Weighted averaging]),
/// clips, steps the optimizer and the LR schedule, and keeps the meters.
class Controller {
 public:
  Controller(Task& task, std::shared_ptr<torch::nn::Module> model, std::unique_ptr<optim::Optimizer> optimizer,
             std::unique_ptr<optim::LrScheduler> lr_scheduler, std::shared_ptr<GradientReducer> reducer,
             ControllerOptions options, std::shared_ptr<CollectiveChannel> channel = nullptr);

  /// This rank's vote to stop the run after the coming update (a signal arrived; Note [Clean stops]). It
  /// travels with the update's statistics, so agreeing costs no round trip; the result's stop_agreed
  /// says whether any rank voted.
  void vote_stop(bool stop) { stop_vote_ = stop; }

  /// One update from this rank's micro-batches. Empty ones take part with zero weight and never reach
  /// the task (see Note [Empty micro-batches]). Under loss scaling an update whose gradients overflow
  /// is skipped (see UpdateResult::skipped).
  UpdateResult train_update(const std::vector<Batch>& micro_batches);

  /// End of `epoch`: lets the LR scheduler pick the next epoch's rate; returns it.
  double lr_step(int64_t epoch, std::optional<double> val_loss);
  double lr() const { return optimizer_->lr(); }

  int64_t num_updates() const { return num_updates_; }
  /// Sets the update count (resume) and the matching learning rate.
  void set_num_updates(int64_t n);

  /// The statistics of the epoch so far, as logged (loss, nll_loss, ppl, wps, ups, wpb, bsz,
  /// num_updates, lr, gnorm, clip, train_wall, wall, and the task's derived metrics).
  std::vector<Stat> train_stats() const;
  /// Starts a new epoch of meters.
  void reset_epoch_meters();

  /// A collective that every rank calls before state() at a save or a check: the optimizer gathers what
  /// state() needs from the other ranks (a sharded optimizer's shards; see Note [Sharded optimizer state]).
  void gather_state() { optimizer_->gather_state(); }
  /// The training state as one value (CPU copies), for checkpoints; the optimizer's buffers are left
  /// out when `with_optimizer_state` is false (--no-save-optimizer-state).
  TrainingState state(bool with_optimizer_state = true);
  /// Restores a state(): optimizer state and hyper-parameters (then the overrides), loss scale, LR
  /// schedule, update count, meters and random generators (CPU and CUDA), each unless reset, and hands
  /// the comm hook's state to the gradient reducer. The model's weights are
  /// not touched (see load_model_tensors). Throws hetseq::InputError naming `source` when the
  /// optimizer or schedule kind differs without the matching reset flag.
  void load_state(const TrainingState& state, const ResumeOptions& options, const std::string& source);
  /// The gradient reducer's comm hook state (PowerSGD's), gathered to rank 0 for a checkpoint, which
  /// state() leaves out: a collective that every rank calls at each save (Checkpointer::save). See
  /// Note [PowerSGD in checkpoints].
  std::optional<PowerSgdState> gather_comm_hook_state() { return reducer_->gather_comm_hook_state(); }

  /// The meters and the epoch's summed statistics as named numbers, for checkpoints.
  std::map<std::string, double> meter_state() const;
  /// Restores a meter_state() (resume without --reset-meters).
  void load_meter_state(const std::map<std::string, double>& state);

  torch::nn::Module& model() { return *model_; }
  std::shared_ptr<torch::nn::Module> model_ptr() { return model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  optim::LrScheduler& lr_scheduler() { return *lr_scheduler_; }
  Task& task() { return task_; }
  TrainMeters& meters() { return meters_; }
  /// The loss scaler (null without loss scaling).
  DynamicLossScaler* loss_scaler() { return scaler_.get(); }
  Precision precision() const { return options_.precision; }
  /// Spans of each update's forward, backward, clipping and optimizer step go to `tracer` (null: none),
  /// and the reducer's and channel's spans too. See Note [Tracing].
  void set_tracer(std::shared_ptr<Tracer> tracer);

 private:
  void load_optimizer_state(const TrainingState& state, const std::string& source);
  /// Restores TrainingState::cuda_rng_states where CUDA is available, logging what it cannot restore.
  void load_cuda_rng_states(const std::vector<torch::Tensor>& states, const std::string& source);
  /// Forward and backward of every micro-batch of an update; starts this rank's summed statistics on the
  /// channel at the last backward and counts its reads of the device in `host_reads`.
  void run_micro_batches(const std::vector<Batch>& micro_batches, double loss_scale, int64_t& host_reads);
  /// The backward of micro-batch `index` of `count`, as Task::Backward: autocast off, the loss times
  /// `loss_scale`, the reducer's hooks armed (the last one with the channel's global sample count).
  void run_backward(const torch::Tensor& loss, int64_t index, int64_t count, double loss_scale);
  /// Zero, as a function of every parameter that takes a gradient. See Note [Empty micro-batches].
  torch::Tensor zero_loss();
  /// Divides the reduced gradients by samples x loss scale, measures their norm and clips them; sets
  /// `result.skipped` on overflow under loss scaling.
  void normalise_and_clip(double sample_size, UpdateResult& result);
  /// The meters and epoch sums after an applied update.
  void update_meters(const UpdateResult& result);

  Task& task_;
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LrScheduler> lr_scheduler_;
  std::shared_ptr<GradientReducer> reducer_;
  ControllerOptions options_;
  std::shared_ptr<CollectiveChannel> channel_;
  bool stop_vote_ = false;  // this rank's vote for the coming update
  std::unique_ptr<DynamicLossScaler> scaler_;
  std::shared_ptr<Tracer> tracer_;
  int64_t num_updates_ = 0;
  TrainMeters meters_;
  LogSums epoch_sums_;  // [stat name] summed over the epoch's updates, for derived metrics
};

}  // namespace hetseq
