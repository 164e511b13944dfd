#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Event.h>
#include <torch/nn/module.h>

#include "hetseq/data/dataset.h"
#include "hetseq/optim/lr_scheduler.h"
#include "hetseq/optim/optimizer.h"
#include "hetseq/task/task.h"
#include "hetseq/observe/tracer.h"
#include "hetseq/channel/collective_channel.h"
#include "hetseq/reduce/gradient_reducer.h"
#include "hetseq/shard/sharding_strategy.h"
#include "hetseq/train/frozen_values.h"
#include "hetseq/train/graph_capture.h"
#include "hetseq/train/loss_scaler.h"
#include "hetseq/train/gradient_clipping.h"
#include "hetseq/train/meters.h"
#include "hetseq/train/precision.h"
#include "hetseq/observe/progress.h"
#include "hetseq/checkpoint/training_state.h"

namespace hetseq {

/// What the Controller needs from the command line.
struct ControllerOptions {
  double clip_norm = kDefaultClipNorm;  // --clip-norm: largest gradient norm; 0 turns clipping off
  uint64_t seed = 1;      // --seed: with the update count and rank, seeds dropout for each update
  int64_t rank = 0;
  torch::Device device = torch::kCPU;
  Precision precision = Precision::kFloat32;  // --fp16, --bf16: the forward passes' autocast
  /// Dynamic loss scaling (set with --fp16; allowed with any precision). See Note [Loss scaling].
  std::optional<LossScalerOptions> loss_scaling;
  /// Read the device's values of an update (gradient norm, statistics) after the next update, not inside
  /// it (Note [Reading an update late]); ignored under loss scaling. False: each UpdateResult is complete
  /// when train_update returns, at the price of the host waiting for the device twice an update (for
  /// programs whose observers need every update's loss at once).
  bool read_late = true;
  /// --cuda-graph: replay updates of one shape from a CUDA graph (Note [CUDA-graph updates]); where the
  /// run cannot be captured, one line says why and it trains uncaptured.
  bool cuda_graph = false;
  /// Makes the capture object for --cuda-graph; empty: make_graph_capture. Tests pass a double.
  GraphCaptureFactory graph_capture;
};

/// What one update did, after reduction over all ranks.
struct UpdateResult {
  LogSums sums;         // summed over micro-batches and ranks (without the device's values when `late`)
  double gnorm = 0;     // gradient norm before clipping (inf or NaN when the update overflowed; NaN when `late`)
  bool clipped = false;
  /// The update's device values (gradient norm, clipping, the task's device statistics) are read later,
  /// into the meters, without making the host wait for the device here. See Note [Reading an update late].
  bool late = false;
  /// The gradients overflowed under loss scaling: no step was taken, the update count did not move,
  /// and the loss scale went down. Every rank gets the same answer. See Note [Loss scaling].
  bool skipped = false;
  double loss_scale = 1;  // the scale this update's loss was multiplied by
  /// Times the update read values from the device on the host: the statistics (once, however many
  /// micro-batches) and the gradient norm. See Note [Statistics on the device].
  int64_t host_reads = 0;
  /// Some rank voted to stop the run after this update; the same on every rank (Note [Clean stops]).
  bool stop_agreed = false;
  /// How the gradients travelled: buckets, bytes, times (zeros for one process).
  ReductionTiming reduction;
  /// The update was a replay of the captured CUDA graph (Note [CUDA-graph updates]).
  bool replayed = false;
};

/// Runs updates: accumulates the gradients of an update's micro-batches, has its ShardingStrategy
/// reduce them over the ranks (through the GradientReducer) and the CollectiveChannel the statistics
/// and stop votes (Note [Communication roles]), normalises by the total sample size (see Note
/// [Weighted averaging]), clips, has the strategy step its part and gather the parameters, steps the
/// LR schedule, and keeps the meters.
class Controller {
 public:
  /// `sharding` holds the optimizer (which `lr_scheduler` drives) and the gradient reducer.
  Controller(Task& task, std::shared_ptr<torch::nn::Module> model, std::unique_ptr<ShardingStrategy> sharding,
             std::unique_ptr<optim::LrScheduler> lr_scheduler, ControllerOptions options,
             std::shared_ptr<CollectiveChannel> channel = nullptr);
  /// Without sharding (NoSharding over `optimizer` and `reducer`).
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

  /// The channel of the updates' statistics from the next update on: the run's, or one over the ranks that
  /// take part while others sit out (Note [Sharing an update]). Called between updates.
  void set_update_channel(std::shared_ptr<CollectiveChannel> channel);
  /// Seconds of one forward and backward pass of `batch` on this rank alone, the gradients then zeroed and
  /// the model left as it was: how a rank that sits out keeps being measured (Note [Sitting out]). Nothing
  /// leaves the process.
  double probe(const Batch& batch);

  /// End of `epoch`: lets the LR scheduler pick the next epoch's rate; returns it.
  double lr_step(int64_t epoch, std::optional<double> val_loss);
  double lr() const { return sharding_->optimizer().lr(); }

  int64_t num_updates() const { return num_updates_; }
  /// Sets the update count (resume) and the matching learning rate.
  void set_num_updates(int64_t n);

  /// The statistics of the epoch so far, as logged (loss, nll_loss, ppl, wps, ups, wpb, bsz,
  /// num_updates, lr, gnorm, clip, train_wall, wall, and the task's derived metrics). Reads the last
  /// update's late values first (read_late_update).
  std::vector<Stat> train_stats();
  /// Waits for the device to finish the last update's values that were left to be read late, adds them
  /// to the meters and returns that update's result, complete (Note [Reading an update late]); nothing
  /// when there are none. Throws hetseq::InputError when that update's gradient norm was not finite.
  std::optional<UpdateResult> read_late_update();
  /// Starts a new epoch of meters.
  void reset_epoch_meters();

  /// The training state as one value (CPU copies), for checkpoints; the optimizer's buffers are left
  /// out when `with_optimizer_state` is false (--no-save-optimizer-state), and are each rank's shard
  /// file's where the sharding strategy keeps them in shards (ShardingStrategy::state_piece).
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
  std::optional<PowerSgdState> gather_comm_hook_state() { return sharding_->reducer().gather_comm_hook_state(); }

  /// The meters and the epoch's summed statistics as named numbers, for checkpoints.
  std::map<std::string, double> meter_state();
  /// Restores a meter_state() (resume without --reset-meters).
  void load_meter_state(const std::map<std::string, double>& state);

  torch::nn::Module& model() { return *model_; }
  std::shared_ptr<torch::nn::Module> model_ptr() { return model_; }
  optim::Optimizer& optimizer() { return sharding_->optimizer(); }
  /// How the update is spread over the ranks (--zero-sharding): the checkpoint asks it for its part.
  ShardingStrategy& sharding() { return *sharding_; }
  optim::LrScheduler& lr_scheduler() { return *lr_scheduler_; }
  Task& task() { return task_; }
  TrainMeters& meters() { return meters_; }
  /// The loss scaler (null without loss scaling).
  DynamicLossScaler* loss_scaler() { return scaler_.get(); }
  Precision precision() const { return options_.precision; }
  /// Spans of each update's forward, backward, clipping and optimizer step go to `tracer` (null: none),
  /// and the reducer's and channel's spans too. See Note [Tracing].
  void set_tracer(std::shared_ptr<Tracer> tracer);
  /// The training data, whose samples 0 and 1 are the batch of a stand-in pass under --zero-sharding full (Note
  /// [Stand-in passes]). The session sets it; a Controller without it refuses a stand-in pass.
  void set_stand_in_data(std::shared_ptr<Dataset> data) { stand_in_data_ = std::move(data); }

 private:
  void load_optimizer_state(const TrainingState& state, const std::string& source);
  /// Restores TrainingState::cuda_rng_states where CUDA is available, logging what it cannot restore.
  void load_cuda_rng_states(const std::vector<torch::Tensor>& states, const std::string& source);
  /// Forward and backward of every micro-batch of an update; starts this rank's summed statistics on the
  /// channel at the last backward and counts its reads of the device in `host_reads`.
  void run_micro_batches(const std::vector<Batch>& micro_batches, double loss_scale, int64_t& host_reads);
  /// After the update's backward passes: the reducer's sums and the channel's agreement (statistics, stop
  /// vote, timing) into `result`.
  void finish_round(UpdateResult& result);
  /// The backward of micro-batch `index` of `count`, as Task::Backward: autocast off, the loss times
  /// `loss_scale`, the reducer's hooks armed (the last one with the channel's global sample count).
  void run_backward(const torch::Tensor& loss, int64_t index, int64_t count, double loss_scale);
  /// Zero, as a function of every parameter that takes a gradient. See Note [Empty micro-batches].
  torch::Tensor zero_loss();
  /// Under a strategy that needs every rank to run as many passes (--zero-sharding full): `micro_batches`
  /// with empty ones in front up to the passes of the rank that runs most (a collective), and the stand-in
  /// batch kept.
  std::vector<Batch> padded_for_stand_ins(const std::vector<Batch>& micro_batches);
  /// An empty micro-batch's pass under --zero-sharding full: the stand-in batch's forward and backward, its
  /// loss times 0, with the generator states put back after. See Note [Sharded parameters].
  void stand_in_pass(const Task::Backward& backward);
  /// Divides the reduced gradients by samples x loss scale, measures their norm and clips them; sets
  /// `result.skipped` on overflow under loss scaling.
  void normalise_and_clip(double sample_size, UpdateResult& result);
  /// The update as the host runs it, operator by operator.
  UpdateResult eager_update(const std::vector<Batch>& micro_batches);
  /// Whether `micro_batches` can take the captured path: one non-empty micro-batch of the captured shape.
  bool fits_graph(const std::vector<Batch>& micro_batches);
  /// An eager update on the capture stream before the capture; checks that the task's sample size follows the
  /// batch's shape (Note [Values frozen at capture]).
  UpdateResult warm_up_update(const std::vector<Batch>& micro_batches);
  /// Records the update's forward, backward and clipping on `batch`'s shape into graph_ (Note [CUDA-graph
  /// updates]), then trains `batch` by replaying it.
  UpdateResult capture_update(const Batch& batch);
  /// One update by copying `batch` into the graph's inputs and replaying it, then the optimizer step; eager
  /// instead, and from then on, when a value frozen at the capture changed (Note [Values frozen at capture]).
  UpdateResult replay_update(const Batch& batch);
  /// The graph is dropped and one line says why (`why`): this update and every later one train eagerly.
  void graph_off(const std::string& why);
  /// The values a captured update of `batch` would freeze, with the task's sample size `sample_size`.
  FrozenValues graph_values(const Batch& batch, double sample_size);
  static constexpr int64_t kGraphWarmUps = 3;  // eager updates before the capture (Note [CUDA-graph updates])
  /// Whether this update's device values are read late: not under loss scaling, whose skip decision
  /// the host needs at once. See Note [Reading an update late].
  bool reads_late() const { return options_.read_late && scaler_ == nullptr; }
  /// Starts the copy of the update's late values (late_sums_, late_norm_) to the host and keeps them as
  /// pending_.
  void keep_late(UpdateResult result);
  /// The end of an applied update: the count, the learning rate, the meters (or the late values kept and the
  /// previous ones read), the update's wall time.
  void end_update(const UpdateResult& result);
  /// The meters and epoch sums after an applied update.
  void update_meters(const UpdateResult& result);

  Task& task_;
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<ShardingStrategy> sharding_;  // the optimizer and the gradient reducer
  std::unique_ptr<optim::LrScheduler> lr_scheduler_;
  ControllerOptions options_;
  std::shared_ptr<CollectiveChannel> channel_;
  bool stop_vote_ = false;  // this rank's vote for the coming update
  std::unique_ptr<DynamicLossScaler> scaler_;
  std::shared_ptr<Tracer> tracer_;
  int64_t num_updates_ = 0;
  TrainMeters meters_;
  LogSums epoch_sums_;  // [stat name] summed over the epoch's updates, for derived metrics
  /// The device statistics of the update in progress, summed over the ranks on the device by its channel round.
  LateSums late_sums_;
  torch::Tensor late_norm_;  // the update's gradient norm on the device (float64), when read late
  std::shared_ptr<Dataset> stand_in_data_;  // --zero-sharding full: where the stand-in batch comes from
  Batch stand_in_;           // samples 0 and 1 of it, collated once (on the host): Note [Stand-in passes]
  /// An update whose device values are on their way to the host. See Note [Reading an update late].
  struct PendingUpdate {
    UpdateResult result;
    LateSums late;                   // the late device statistics' names and rows (the rows' values in `values`)
    torch::Tensor values;            // float64 [rows x names, then the norm] in host memory (pinned on CUDA)
    std::shared_ptr<c10::Event> copied;  // recorded after the copy on a CUDA device; null elsewhere
    int64_t update = 0;              // its number, for messages
  };
  std::optional<PendingUpdate> pending_;
  /// Note [CUDA-graph updates]: off, the next fitting update eager on the capture stream, then captured,
  /// then replayed.
  enum class GraphState { kOff, kWarmUp, kCapture, kReplay };
  GraphState graph_state_ = GraphState::kOff;
  std::unique_ptr<GraphCapture> graph_;
  Batch graph_batch_;          // the graph's inputs, on the device: each replay copies its batch into them
  LogSums graph_host_log_;     // the captured update's host statistics (one shape, one value: the task's contract)
  LogTensors graph_tensors_;   // its device statistics, in the graph's memory, rewritten by every replay
  torch::Tensor graph_norm_;   // its gradient norm, likewise
  bool graph_shape_told_ = false;  // the line about a batch of another shape was printed
  int64_t graph_warm_ups_ = 0;     // eager warm-up updates run on the capture stream so far
  /// The last warm-up's values and its update number: the sample size the task gave its shape (Note [Values
  /// frozen at capture]).
  std::optional<std::pair<FrozenValues, int64_t>> graph_seen_;
  FrozenValues graph_frozen_;  // the captured update's, checked before every replay
  /// The graph holds the optimizer step too, whose host part runs before each replay (Note [The step in a CUDA
  /// graph]): a world of one without sharding, and an optimizer that splits its step.
  bool graph_steps_ = false;
};

}  // namespace hetseq
