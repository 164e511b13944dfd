#include "hetseq/train/controller.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"

namespace hetseq {
namespace {

void add_into(LogSums& into, const LogSums& from) {
  for (const auto& [k, v] : from) into[k] += v;
}

/// The error of an update whose gradient norm `gnorm` is not finite.
InputError diverged(int64_t update, double gnorm) {
  return InputError(fmt::format(
      "update {}: the gradient norm is {} on every rank, so the update would ruin the model. The loss diverged "
      "(lower --lr or use --clip-norm), or, with --ddp-comm-hook fp16, the summed gradients overflowed "
      "float16's range on the wire (use --ddp-comm-hook bf16, or --fp16 whose loss scaling skips such updates)",
      update, gnorm));
}

/// A step's statistics into an update's sums: the host ones (sample_size from its field) and the device ones.
void add_step(LogSums& into, LogTensors& into_tensors, const StepOutput& step) {
  for (const auto& [name, value] : step.log) {
    if (name != "sample_size") into[name] += value;
  }
  into["sample_size"] += step.sample_size;
  add_log_tensors(into_tensors, logged_tensors(step));
}

// HETSEQ_TEST_MICRO_BATCH_DELAY=FILE: each micro-batch first sleeps the milliseconds that FILE holds when it is
// read (none while it is missing or empty), so that a test makes one rank slow by a fixed cost per micro-batch
// and can change it while the run goes on (tests/balance/test_sit_out.cpp). Off without the variable.
void test_micro_batch_delay() {
  static const char* path = std::getenv("HETSEQ_TEST_MICRO_BATCH_DELAY");
  if (!path) return;
  std::ifstream file(path);
  double ms = 0;
  if (file >> ms && ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

// Dropout and other randomness of an update depend only on (seed, update, rank), so that a resumed
// run draws what the uninterrupted one drew.
uint64_t update_seed(uint64_t seed, int64_t num_updates, int64_t rank) {
  uint64_t x = seed ^ (static_cast<uint64_t>(num_updates) * 0x9E3779B97F4A7C15ULL) ^
               (static_cast<uint64_t>(rank) * 0xC2B2AE3D27D4EB4FULL);
  x ^= x >> 31;
  return x & 0x7FFFFFFFFFFFFFFFULL;
}

}  // namespace

Controller::Controller(Task& task, std::shared_ptr<torch::nn::Module> model,
                       std::unique_ptr<optim::Optimizer> optimizer, std::unique_ptr<optim::LrScheduler> lr_scheduler,
                       std::shared_ptr<GradientReducer> reducer, ControllerOptions options,
                       std::shared_ptr<CollectiveChannel> channel)
    : task_(task),
      model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      lr_scheduler_(std::move(lr_scheduler)),
      reducer_(std::move(reducer)),
      options_(options),
      channel_(channel ? std::move(channel) : std::make_shared<LocalChannel>()) {
  HETSEQ_ASSERT(model_ && optimizer_ && lr_scheduler_ && reducer_, "Controller built with a null part");
  HETSEQ_ASSERT(options_.clip_norm >= 0, "Controller built with a negative clip norm (OptimizationOptions::validate)");
  check_precision_supported(options_.precision, options_.device, "--" + to_string(options_.precision));
  if (options_.loss_scaling) scaler_ = std::make_unique<DynamicLossScaler>(*options_.loss_scaling);
  if (options_.cuda_graph) {
    std::string why;
    if (channel_->world_size() > 1) {
      why = fmt::format("{} ranks: the gradient reduction and the statistics of a distributed update go through the "
                        "process group, which hetseq does not capture",
                        channel_->world_size());
    } else if (scaler_) {
      why = "--fp16's loss scaling decides on the host, after each update, whether it is skipped";
    } else if (!options_.read_late) {
      why = "the update's values are read inside it (ControllerOptions::read_late is off)";
    } else {
      graph_ = make_graph_capture(options_.device, why);
    }
    if (graph_) {
      graph_state_ = GraphState::kWarmUp;
      log::info("[cuda-graph] updates of one micro-batch of one shape: one eager warm-up update, then forward, "
                "backward and clipping captured once and replayed");
    } else {
      log::warn("[cuda-graph] not captured: {}; training goes on uncaptured", why);
    }
  }
}

// Note [Weighted averaging]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The update must equal the gradient of the mean loss over every sample of the global step, whatever
// the per-rank batch sizes b_r and update frequencies u_r. Tasks return losses *summed* over their
// samples, L_{r,k} = sum_{i in batch (r,k)} l_i, with the count s_{r,k} they sum over. Backward
// accumulates g_r = sum_k grad L_{r,k} on each rank; the reducer sums over ranks, G = sum_r g_r, and
// the sample counts, S = sum_{r,k} s_{r,k}. Then
//     G / S = grad( (1/S) sum_{all samples i} l_i ),
// the gradient of the global mean, exactly: no rank's batch is weighted by anything but its size. An
// empty micro-batch contributes 0 to both sums (see Note [Empty micro-batches]). (Averaging per-rank
// mean gradients instead, as plain data parallelism does, weighs a sample of a small batch more than
// one of a large batch.)

// Note [Empty micro-batches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// At the end of an epoch a rank's slice of the last update can be short or empty (Note [Data plan]),
// but every rank must still run the same backward passes: the gradient reducer arms its hooks for the
// last micro-batch of every update, and each bucket's allreduce starts only when every parameter in it
// has had its hook fire. So the Controller, not the task, runs an empty micro-batch: it never calls the
// task, builds Z = sum_p 0 * sum(p) over every parameter p that takes a gradient, and runs Z through
// the same backward as a real loss (autocast off, times the loss scale, the reducer armed), so every
// hook fires as on the other ranks. dZ/dp = 0 exactly, whatever p holds, so the gradients, and G and S
// of Note [Weighted averaging], get nothing from it.
//
// An empty micro-batch adds nothing to the update's statistics either: a rank whose micro-batches are
// all empty reports no names at all (not even sample_size), because it cannot know the names the task
// reports. The statistics sync sums the union of the names then; with --fast-stat-sync, ranks that
// report nothing are the one difference it accepts (Note [Stat sync]). With --find-unused-parameters,
// Z counts every parameter as used on that rank, so in such an update a parameter that no other rank
// used gets a zero gradient instead of none (as HetSeq's dummy batch, a real batch times 0, does for the
// parameters it reaches).

void Controller::set_update_channel(std::shared_ptr<CollectiveChannel> channel) {
  HETSEQ_ASSERT(channel && !channel_->update_started(), "set_update_channel inside an update");
  channel_ = std::move(channel);
  if (tracer_) channel_->set_tracer(tracer_);
}

double Controller::probe(const Batch& batch) {
  HETSEQ_ASSERT(!batch.empty(), "a probe of an empty batch");
  const auto start = std::chrono::steady_clock::now();
  model_->train();
  test_micro_batch_delay();
  // Plain backward: the reducer is not armed, so nothing leaves this process (Note [Bucketed reduction]).
  const Task::Backward backward = [&](const StepOutput& step) {
    const AutocastGuard no_autocast(options_.device, Precision::kFloat32);
    step.loss.to(torch::kFloat32).backward();
  };
  {
    const AutocastGuard autocast(options_.device, options_.precision);
    task_.train_step(*model_, batch.to(options_.device), backward);
  }
  optimizer_->zero_grad();
  if (options_.device.is_cuda()) {
    const c10::impl::VirtualGuardImpl impl(options_.device.type());
    impl.getStream(options_.device).synchronize();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Controller::set_tracer(std::shared_ptr<Tracer> tracer) {
  tracer_ = tracer;
  reducer_->set_tracer(tracer);
  channel_->set_tracer(std::move(tracer));
}

UpdateResult Controller::train_update(const std::vector<Batch>& micro_batches) {
  HETSEQ_ASSERT(!micro_batches.empty(), "an update with no micro-batches");
  if (graph_state_ == GraphState::kOff || !fits_graph(micro_batches)) return eager_update(micro_batches);
  switch (graph_state_) {
    case GraphState::kWarmUp: {
      UpdateResult result;
      graph_->warm_up([&] { result = eager_update(micro_batches); });
      graph_state_ = GraphState::kCapture;
      return result;
    }
    case GraphState::kCapture:
      return capture_update(micro_batches.front().to(options_.device));
    default:
      return replay_update(micro_batches.front().to(options_.device));
  }
}

UpdateResult Controller::eager_update(const std::vector<Batch>& micro_batches) {
  meters_.train_wall.start();
  model_->train();
  torch::manual_seed(update_seed(options_.seed, num_updates_, options_.rank));
  optimizer_->zero_grad();

  UpdateResult result;
  result.loss_scale = scaler_ ? scaler_->scale() : 1.0;
  reducer_->before_forward();
  run_micro_batches(micro_batches, result.loss_scale, result.host_reads);
  if (!channel_->update_started()) {
    throw InputError(fmt::format("rank {} of {}: the task's train_step returned without calling the Backward it "
                                 "was given for the update's last micro-batch; a Task::train_step must run its loss "
                                 "through that Backward",
                                 channel_->rank(), channel_->world_size()));
  }
  finish_round(result);
  const double sample_size = sum_or(result.sums, "sample_size");
  HETSEQ_ASSERT(sample_size > 0, "an update with no samples on any rank");

  {
    const TraceSpan span(tracer_.get(), "clip_grad");
    normalise_and_clip(sample_size, result);
  }
  if (result.skipped) {
    // The same on every rank: the reduced gradients are. See Note [Loss scaling].
    optimizer_->zero_grad();
    meters_.train_wall.stop();
    scaler_->update(true);
    log::info("[fp16] gradient overflow at update {} (loss scale {}): update skipped, loss scale now {}",
              num_updates_ + 1, result.loss_scale, scaler_->scale());
    return result;
  }
  if (scaler_) scaler_->update(false);
  {
    const TraceSpan span(tracer_.get(), "optimizer");
    optimizer_->step();
  }
  end_update(result);
  return result;
}

void Controller::end_update(const UpdateResult& result) {
  ++num_updates_;
  lr_scheduler_->step_update(num_updates_);
  if (result.late) {
    // The previous update's values have long been computed; this one's are read after the next update.
    read_late_update();
    keep_late(result);
  } else {
    update_meters(result);
  }
  meters_.train_wall.stop();
}

// Note [CUDA-graph updates]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// With batches of one shape, an update launches the same kernels with the same arguments every time: on a GPU
// with a batch that is small for it, launching them costs more than running them. --cuda-graph records the
// kernels of an update once into a CUDA graph and replays it (at::cuda::CUDAGraph):
// - when: a world of one, no --fp16 loss scaling (its skip decision is the host's), updates of one micro-batch;
//   the task pads its batches to one shape (TaskContext::static_shapes; BERT: Note [Static BERT batches]).
//   Elsewhere the constructor prints one line saying why, and every update is eager.
// - what: zeroing the gradients, the forward pass (under autocast, its cast cache off while capturing), the
//   backward pass, the division by the sample count, the gradient norm and the clip, decided on the device
//   (Note [Reading an update late]). The graph's inputs are static device tensors that each replay first
//   copies its batch into; its outputs (the statistics, the norm) live in the graph's memory and are copied to
//   the host after each replay as an eager update's are.
// - order: the first fitting update runs eagerly on the capture stream (cuBLAS's and cuDNN's lazy set-up
//   happens there, outside a capture, and the optimizer makes its state); the second is captured and then
//   replayed; every later one is replayed. A batch of another shape (the short last batch of an epoch) trains
//   eagerly in between; the line that says so comes once.
// - dropout: the update's seed is set before each replay; the graph reads the CUDA generator's seed and offset
//   when it is replayed, so each update draws its own masks.
// - the optimizer step runs eagerly after the replay: hetseq's Adam passes the fused kernel an epsilon that
//   depends on the step count (Note [Fused Adam]), a host number that a graph would freeze. It is a handful of
//   multi-tensor launches; the forward and backward passes are the thousand-odd launches that a graph saves.
// - the host statistics (sample_size, ...) are those of the captured update: the task's contract for static
//   shapes is that they depend on the batch's shape only (BERT counts its masked tokens on the device then).

bool Controller::fits_graph(const std::vector<Batch>& micro_batches) {
  const Batch& batch = micro_batches.front();
  bool fits = micro_batches.size() == 1 && !batch.empty();
  if (fits && graph_state_ == GraphState::kReplay) {
    fits = batch.num_samples == graph_batch_.num_samples && batch.fields.size() == graph_batch_.fields.size();
    for (const auto& [name, tensor] : graph_batch_.fields) {
      const auto it = batch.fields.find(name);
      fits = fits && it != batch.fields.end() && it->second.sizes() == tensor.sizes() &&
             it->second.scalar_type() == tensor.scalar_type();
    }
  }
  if (!fits && !graph_shape_told_) {
    graph_shape_told_ = true;
    log::info("[cuda-graph] update {} has {} micro-batch(es) of {} samples, not one of the captured shape: it and "
              "any other such update train uncaptured",
              num_updates_ + 1, micro_batches.size(), batch.num_samples);
  }
  return fits;
}

UpdateResult Controller::capture_update(const Batch& batch) {
  {
    torch::NoGradGuard no_grad;
    graph_batch_ = Batch();
    graph_batch_.num_samples = batch.num_samples;
    for (const auto& [name, tensor] : batch.fields) graph_batch_.fields.emplace(name, tensor.clone());
  }
  model_->train();
  torch::manual_seed(update_seed(options_.seed, num_updates_, options_.rank));
  try {
    graph_->capture([&] {
      optimizer_->zero_grad();
      LogSums local;
      LogTensors local_tensors;
      bool called = false;
      const Task::Backward backward = [&](const StepOutput& step) {
        add_step(local, local_tensors, step);
        called = true;
        run_backward(step.loss, 0, 1, 1.0);
      };
      {
        const AutocastGuard autocast(options_.device, options_.precision);
        task_.train_step(*model_, graph_batch_, backward);
      }
      if (!called) {
        throw InputError("--cuda-graph: the task's train_step returned without calling the Backward it was given");
      }
      UpdateResult captured;
      captured.loss_scale = 1.0;
      normalise_and_clip(sum_or(local, "sample_size"), captured);
      graph_host_log_ = std::move(local);
      graph_tensors_ = std::move(local_tensors);
      graph_norm_ = late_norm_;
    });
  } catch (const c10::Error& e) {
    graph_state_ = GraphState::kOff;
    graph_ = nullptr;
    graph_batch_ = Batch();
    log::warn("[cuda-graph] not captured: the update could not be recorded ({}); training goes on uncaptured",
              e.what_without_backtrace());
    return eager_update({batch});
  }
  graph_state_ = GraphState::kReplay;
  log::info("[cuda-graph] update {} captured: {} samples a batch, replayed from now on", num_updates_ + 1,
            batch.num_samples);
  return replay_update(batch);
}

UpdateResult Controller::replay_update(const Batch& batch) {
  meters_.train_wall.start();
  model_->train();
  torch::manual_seed(update_seed(options_.seed, num_updates_, options_.rank));
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : graph_batch_.fields) tensor.copy_(batch.fields.at(name), /*non_blocking=*/true);
  }
  UpdateResult result;
  result.loss_scale = 1.0;
  reducer_->before_forward();
  channel_->start_update(graph_host_log_, stop_vote_);
  {
    const TraceSpan span(tracer_.get(), "graph_replay");
    graph_->replay();
  }
  finish_round(result);
  late_tensors_ = graph_tensors_;
  late_norm_ = graph_norm_;
  result.gnorm = std::nan("");
  result.late = true;
  {
    const TraceSpan span(tracer_.get(), "optimizer");
    optimizer_->step();
  }
  end_update(result);
  return result;
}

// Note [Reading an update late]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A host that reads a device value inside an update waits for the device to get there, and the device then
// idles while the host launches the rest of the update: on a GPU with small kernels most of the update's
// time. The host needs two kinds of device values:
// - the gradient norm, for clipping: the clip coefficient min(1, clip / (norm + 1e-6)), exactly where
//   norm > clip as before, is a device tensor that multiplies the gradients (one foreach call per device and
//   dtype); the norm is read only for the log.
// - the task's device statistics (losses, correct counts; Note [Statistics on the device]), for the log.
//   In a world of one no rank has to add them up, so they stay on the device too. With several ranks the
//   channel's round sums them with the sample counts at the last backward (Note [Stat sync]), so they are
//   read there, once.
// At the end of an update its late values (the statistics, then the norm) are stacked into one float64
// tensor and copied without blocking into pinned host memory, with an event recorded after the copy; the
// host reads them at the end of the next update, when the device has long finished them, and adds them
// to the meters then. train_stats() (the log), meter_state() and state() (checkpoints) and the epoch's end
// read the last update at once. A norm that is not finite is the same error as before, one update later:
// the model is ruined either way, and no checkpoint is written after it, since state() reads first.
// Under --fp16 the host reads the norm at once: whether the update is skipped decides the update count,
// the learning rate and the loss scale of the next update on the host (Note [Loss scaling]).
void Controller::keep_late(UpdateResult result) {
  torch::NoGradGuard no_grad;
  PendingUpdate p;
  std::vector<torch::Tensor> values;  // [value] float64 scalars on the device
  for (const auto& [name, value] : late_tensors_) {
    p.names.push_back(name);
    values.push_back(value.detach().reshape({}).to(torch::kFloat64));
  }
  late_tensors_.clear();
  values.push_back(late_norm_.reshape({}));
  const torch::Tensor on_device = torch::stack(values);
  const bool cuda = on_device.is_cuda();
  p.values = torch::empty({on_device.size(0)}, torch::TensorOptions().dtype(torch::kFloat64).pinned_memory(cuda));
  p.values.copy_(on_device, /*non_blocking=*/true);
  if (cuda) {
    const c10::impl::VirtualGuardImpl impl(on_device.device().type());
    p.copied = std::make_shared<c10::Event>(on_device.device().type());
    p.copied->record(impl.getStream(on_device.device()));
  }
  p.update = num_updates_;
  p.result = std::move(result);
  pending_ = std::move(p);
}

std::optional<UpdateResult> Controller::read_late_update() {
  if (!pending_) return std::nullopt;
  PendingUpdate p = std::move(*pending_);
  pending_.reset();
  if (p.copied) p.copied->synchronize();
  const double* values = p.values.const_data_ptr<double>();  // host memory, written by the copy
  for (size_t i = 0; i < p.names.size(); ++i) p.result.sums[p.names[i]] += values[i];
  const double gnorm = values[p.names.size()];
  if (!std::isfinite(gnorm)) throw diverged(p.update, gnorm);
  p.result.gnorm = gnorm;
  p.result.clipped = options_.clip_norm > 0 && gnorm > options_.clip_norm;
  p.result.late = false;
  update_meters(p.result);
  return std::move(p.result);
}

void Controller::finish_round(UpdateResult& result) {
  reducer_->finish_update();
  UpdateAgreement agreed = channel_->finish_update();
  result.sums = std::move(agreed.sums);
  result.stop_agreed = agreed.stop;
  result.late_stat_rounds = agreed.late_rounds;
  result.reduction = reducer_->last_timing();
}

void Controller::run_micro_batches(const std::vector<Batch>& micro_batches, double loss_scale, int64_t& host_reads) {
  // [stat name] summed over the non-empty micro-batches before the last (see Note [Empty micro-batches]):
  // what the task knew on the host, and what it computed on the device, added up there until the last
  // backward reads them all at once (Note [Statistics on the device]).
  LogSums local;
  LogTensors local_tensors;
  // What the last micro-batch gave its backward, to hold the task to it after its train_step returns.
  LogSums last_log;
  double last_sample_size = 0;
  const int64_t count = static_cast<int64_t>(micro_batches.size());
  for (int64_t k = 0; k < count; ++k) {
    const bool empty = micro_batches[k].empty();
    // The forward span runs from here to the task's call of `backward` (Note [Tracing]).
    std::optional<TraceSpan> forward(std::in_place, tracer_.get(), "forward", k);
    const Task::Backward backward = [&, k](const StepOutput& step) {
      forward.reset();
      const TraceSpan span(tracer_.get(), "backward", k);
      if (k == count - 1) {
        // The update's statistics are complete now, built once: they travel on the channel during this
        // backward (Note [Stat sync], Note [Communication roles]).
        if (!empty) {
          add_step(local, local_tensors, step);
          last_log = step.log;
          last_sample_size = step.sample_size;
        }
        if (reads_late() && channel_->world_size() == 1) {
          late_tensors_ = local_tensors;  // read after the next update (Note [Reading an update late])
        } else if (add_to_host(local, local_tensors)) {
          ++host_reads;
        }
        channel_->start_update(local, stop_vote_);
      }
      run_backward(step.loss, k, count, loss_scale);
    };
    if (empty) {
      StepOutput zero;
      zero.loss = zero_loss();
      backward(zero);
      continue;
    }
    // The forward pass under autocast (--fp16, --bf16); the backward pass outside it, on the loss times
    // the loss scale, in float32. See Note [Loss scaling].
    test_micro_batch_delay();
    const AutocastGuard autocast(options_.device, options_.precision);
    StepOutput out = task_.train_step(*model_, micro_batches[k].to(options_.device), backward);
    forward.reset();
    if (k != count - 1) {
      add_step(local, local_tensors, out);  // on the device until the last backward reads them all
    } else if (channel_->update_started() && (out.log != last_log || out.sample_size != last_sample_size)) {
      auto show = [](const LogSums& log, double sample_size) {
        std::vector<std::string> parts{fmt::format("sample_size={}", sample_size)};
        for (const auto& [name, value] : log) parts.push_back(fmt::format("{}={}", name, value));
        return fmt::format("{}", fmt::join(parts, ", "));
      };
      throw InputError(fmt::format(
          "rank {} of {}: the task's statistics changed after it called backward for the update's last micro-batch "
          "(given to backward: [{}]; returned: [{}]); a Task::train_step must have its StepOutput's log and "
          "sample_size complete when it calls backward",
          channel_->rank(), channel_->world_size(), show(last_log, last_sample_size), show(out.log, out.sample_size)));
    }
  }
}

void Controller::run_backward(const torch::Tensor& loss, int64_t index, int64_t count, double loss_scale) {
  const AutocastGuard no_autocast(options_.device, Precision::kFloat32);
  const bool low = loss.scalar_type() == torch::kHalf || loss.scalar_type() == torch::kBFloat16;
  const torch::Tensor full = low ? loss.to(torch::kFloat32) : loss;
  const torch::Tensor scaled = scaler_ ? full * loss_scale : full;
  if (index == count - 1) {
    CollectiveChannel* channel = channel_.get();
    reducer_->before_backward(index, count, scaled, [channel] { return channel->update_sample_size(); });
  } else {
    reducer_->before_backward(index, count, scaled);
  }
  scaled.backward();
}

torch::Tensor Controller::zero_loss() {
  // See Note [Empty micro-batches].
  torch::Tensor zero;
  for (const torch::Tensor& p : model_->parameters()) {
    if (!p.requires_grad()) continue;
    const torch::Tensor term = p.sum() * 0;
    zero = zero.defined() ? zero + term : term;
  }
  HETSEQ_ASSERT(zero.defined(), "an empty micro-batch for a model without parameters that take a gradient");
  return zero;
}

// Note [Gradient norm in one pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// After the reduction every gradient is divided by N * S, its norm is taken, the norm is checked for overflow
// and the gradients are clipped, through foreach kernels: per group of gradients with one device and dtype,
// one call divides, one computes the per-tensor norms and one clips; one reduction combines the norms, and the
// host reads the result once: at once under --fp16, after the next update otherwise (Note [Reading an update
// late], where the clip is decided on the device).
// - The norm accumulates in float64, as the per-tensor `g.to(kFloat64).norm()` it replaced did; on a CPU,
//   _foreach_norm(grads, 2, kFloat64) is bit-equal to that (the same float64 reduction per tensor), so the
//   logged gnorm, the clip scale and the parameters are unchanged. The per-tensor norms are combined in
//   parameter order, as before. A float32 accumulation would be about 4x faster on a CPU (22 against 93 ms
//   for BERT-small's gradients on 2 cores, benchmarks/optimizer_step.cpp), but its last bits depend on how a
//   reduction is split across threads, so ranks with different --intra-op-threads could clip by different
//   scales; float64 keeps that difference ~1e-16, far below the resolution of the scale once it multiplies
//   float32 gradients. On CUDA the fast path
//   accumulates a float32/fp16/bf16 gradient in float32 and writes a float64 norm: deterministic, the same on
//   every CUDA rank, but not bit-equal to a CPU rank's norm.
// - The division stays a pass of its own before the norm. Folding it into the clip (one multiply by
//   scale / (N * S)) or into the norm (norm(g) / (N * S)) would round differently from g / (N * S), and
//   _amp_foreach_non_finite_check_and_unscale_ multiplies by 1 / (N * S), which rounds differently too.
// - The overflow check under --fp16 is the norm's finiteness: an inf or NaN element makes its tensor's norm,
//   and so the total, non-finite. No other pass looks for it.
void Controller::normalise_and_clip(double sample_size, UpdateResult& result) {
  torch::NoGradGuard no_grad;
  struct Group {
    std::vector<torch::Tensor> grads;  // [member]
    std::vector<size_t> positions;     // [member] its place among all gradients, in parameter order
  };
  std::map<std::tuple<int, int, int>, Group> groups;  // by (device type, device index, dtype)
  size_t count = 0;
  for (const auto& p : optimizer_->params()) {
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;  // unused on every rank (--find-unused-parameters)
    Group& group = groups[{static_cast<int>(g.device().type()), static_cast<int>(g.device().index()),
                           static_cast<int>(g.scalar_type())}];
    group.grads.push_back(g);
    group.positions.push_back(count++);
  }
  // One division by N * S: see Note [Weighted averaging] and Note [Loss scaling].
  const double divisor = sample_size * result.loss_scale;
  std::vector<torch::Tensor> norms(count);  // [gradient] in parameter order, float64
  for (auto& [key, group] : groups) {
    at::_foreach_div_(group.grads, divisor);
    const std::vector<torch::Tensor> group_norms = at::_foreach_norm(group.grads, 2, torch::kFloat64);
    for (size_t k = 0; k < group_norms.size(); ++k) norms[group.positions[k]] = group_norms[k];
  }
  const torch::Tensor norm = count == 0 ? torch::zeros({}, torch::kFloat64) : torch::stack(norms).norm();
  if (reads_late()) {
    // See Note [Reading an update late]: the same clip as below, decided on the device.
    if (options_.clip_norm > 0) {
      const torch::Tensor clip = at::scalar_tensor(options_.clip_norm, norm.options());
      const torch::Tensor coefficient = at::where(norm.gt(clip), clip.div(norm.add(1e-6)), at::ones_like(norm));
      for (auto& [key, group] : groups) {
        at::_foreach_mul_(group.grads, coefficient.to(group.grads.front().scalar_type()));
      }
    }
    late_norm_ = norm;
    result.gnorm = std::nan("");
    result.late = true;
    return;
  }
  result.gnorm = norm.item<double>();
  ++result.host_reads;
  if (scaler_ && !std::isfinite(result.gnorm)) {
    result.skipped = true;
    return;
  }
  // Stepping would write inf or NaN into every parameter; the run is over either way.
  if (!std::isfinite(result.gnorm)) throw diverged(num_updates_ + 1, result.gnorm);
  if (options_.clip_norm > 0 && result.gnorm > options_.clip_norm) {
    const double scale = options_.clip_norm / (result.gnorm + 1e-6);
    for (auto& [key, group] : groups) at::_foreach_mul_(group.grads, scale);
    result.clipped = true;
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
  add_into(epoch_sums_, result.sums);
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
  stats.push_back({"lr", optimizer_->lr()});
  stats.push_back({"gnorm", meters_.gnorm.avg()});
  stats.push_back({"clip", meters_.clip.avg()});
  if (scaler_) stats.push_back({"loss_scale", scaler_->scale()});
  stats.push_back({"train_wall", std::round(meters_.train_wall.sum_s()), true});
  stats.push_back({"wall", std::round(meters_.wall.elapsed_s()), true});
  for (const auto& [name, value] : task_.derived_metrics(epoch_sums_)) stats.push_back({name, value});
  return stats;
}

}  // namespace hetseq
