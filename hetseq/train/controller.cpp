#include "hetseq/train/controller.h"

#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/test_hooks.h"
#include "hetseq/shard/no_sharding.h"
#include "hetseq/train/controller_detail.h"

namespace hetseq {
namespace detail {

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

// Dropout and other randomness of an update depend only on (seed, update, rank), so that a resumed
// run draws what the uninterrupted one drew.
uint64_t update_seed(uint64_t seed, int64_t num_updates, int64_t rank) {
  uint64_t x = seed ^ (static_cast<uint64_t>(num_updates) * 0x9E3779B97F4A7C15ULL) ^
               (static_cast<uint64_t>(rank) * 0xC2B2AE3D27D4EB4FULL);
  x ^= x >> 31;
  return x & 0x7FFFFFFFFFFFFFFFULL;
}

}  // namespace detail

Controller::Controller(Task& task, std::shared_ptr<torch::nn::Module> model,
                       std::unique_ptr<optim::Optimizer> optimizer, std::unique_ptr<optim::LrScheduler> lr_scheduler,
                       std::shared_ptr<GradientReducer> reducer, ControllerOptions options,
                       std::shared_ptr<CollectiveChannel> channel)
    : Controller(task, std::move(model), std::make_unique<NoSharding>(std::move(optimizer), std::move(reducer)),
                 std::move(lr_scheduler), options, std::move(channel)) {}

Controller::Controller(Task& task, std::shared_ptr<torch::nn::Module> model, std::unique_ptr<ShardingStrategy> sharding,
                       std::unique_ptr<optim::LrScheduler> lr_scheduler, ControllerOptions options,
                       std::shared_ptr<CollectiveChannel> channel)
    : task_(task),
      model_(std::move(model)),
      sharding_(std::move(sharding)),
      lr_scheduler_(std::move(lr_scheduler)),
      options_(options),
      channel_(channel ? std::move(channel) : std::make_shared<LocalChannel>()) {
  HETSEQ_ASSERT(model_ && sharding_ && lr_scheduler_, "Controller built with a null part");
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
      graph_ = options_.graph_capture ? options_.graph_capture(options_.device, why)
                                      : make_graph_capture(options_.device, why);
    }
    if (graph_) {
      graph_state_ = GraphState::kWarmUp;
      // Note [The step in a CUDA graph]: the step too, where the optimizer can split it (Adam).
      graph_steps_ = sharding_->mode() == ZeroSharding::kNone && sharding_->optimizer().use_split_step();
      log::info("[cuda-graph] updates of one micro-batch of one shape: {} eager warm-up updates, then forward, "
                "backward, clipping{} captured once and replayed",
                kGraphWarmUps, graph_steps_ ? " and the optimizer step" : " (not the optimizer step, which "
                                                                          "runs eagerly after each replay)");
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
  detail::run_before_micro_batch_hook();  // a test's slow rank: Note [Test hooks]
  // Plain backward: the reducer is not armed, so nothing leaves this process (Note [Bucketed reduction]).
  const Task::Backward backward = [&](const StepOutput& step) {
    const AutocastGuard no_autocast(options_.device, Precision::kFloat32);
    step.loss.to(torch::kFloat32).backward();
  };
  {
    const AutocastGuard autocast(options_.device, options_.precision);
    task_.train_step(*model_, batch.to(options_.device), backward);
  }
  sharding_->optimizer().zero_grad();
  if (options_.device.is_cuda()) {
    const c10::impl::VirtualGuardImpl impl(options_.device.type());
    impl.getStream(options_.device).synchronize();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Controller::set_tracer(std::shared_ptr<Tracer> tracer) {
  tracer_ = tracer;
  sharding_->reducer().set_tracer(tracer);
  channel_->set_tracer(std::move(tracer));
}

UpdateResult Controller::train_update(const std::vector<Batch>& micro_batches) {
  HETSEQ_ASSERT(!micro_batches.empty(), "an update with no micro-batches");
  if (graph_state_ == GraphState::kOff || !fits_graph(micro_batches)) return eager_update(micro_batches);
  switch (graph_state_) {
    case GraphState::kWarmUp:
      return warm_up_update(micro_batches);
    case GraphState::kCapture:
      return capture_update(micro_batches.front().to(options_.device));
    default:
      return replay_update(micro_batches.front().to(options_.device));
  }
}

UpdateResult Controller::eager_update(const std::vector<Batch>& micro_batches) {
  meters_.train_wall.start();
  model_->train();
  torch::manual_seed(detail::update_seed(options_.seed, num_updates_, options_.rank));
  sharding_->optimizer().zero_grad();

  UpdateResult result;
  result.loss_scale = scaler_ ? scaler_->scale() : 1.0;
  sharding_->reducer().before_forward();
  if (sharding_->needs_stand_ins()) {
    run_micro_batches(padded_for_stand_ins(micro_batches), result.loss_scale, result.host_reads);
  } else {
    run_micro_batches(micro_batches, result.loss_scale, result.host_reads);
  }
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
    sharding_->optimizer().zero_grad();
    meters_.train_wall.stop();
    scaler_->update(true);
    log::info("[fp16] gradient overflow at update {} (loss scale {}): update skipped, loss scale now {}",
              num_updates_ + 1, result.loss_scale, scaler_->scale());
    return result;
  }
  if (scaler_) scaler_->update(false);
  {
    const TraceSpan span(tracer_.get(), "optimizer");
    sharding_->step();
    sharding_->gather();
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

void Controller::finish_round(UpdateResult& result) {
  sharding_->reduce();
  UpdateAgreement agreed = channel_->finish_update();
  result.sums = std::move(agreed.sums);
  result.stop_agreed = agreed.stop;
  late_sums_ = std::move(agreed.late);
  result.host_reads += agreed.host_reads;
  result.reduction = sharding_->reducer().last_timing();
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
          detail::add_step(local, local_tensors, step);
          last_log = step.log;
          last_sample_size = step.sample_size;
        }
        if (!reads_late()) {
          if (add_to_host(local, local_tensors)) ++host_reads;
          local_tensors.clear();
        }
        // The device statistics stay there: summed over the ranks on the device and read after the next
        // update (Note [Reading an update late], Note [Stat sync]).
        channel_->start_update(local, local_tensors, stop_vote_);
      }
      run_backward(step.loss, k, count, loss_scale);
    };
    if (empty && sharding_->needs_stand_ins()) {
      stand_in_pass(backward);
      continue;
    }
    if (empty) {
      StepOutput zero;
      zero.loss = zero_loss();
      backward(zero);
      continue;
    }
    // The forward pass under autocast (--fp16, --bf16); the backward pass outside it, on the loss times
    // the loss scale, in float32. See Note [Loss scaling].
    detail::run_before_micro_batch_hook();  // a test's slow rank: Note [Test hooks]
    const AutocastGuard autocast(options_.device, options_.precision);
    StepOutput out = task_.train_step(*model_, micro_batches[k].to(options_.device), backward);
    forward.reset();
    if (k != count - 1) {
      detail::add_step(local, local_tensors, out);  // on the device until the last backward reads them all
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
    sharding_->reducer().before_backward(index, count, scaled, [channel] { return channel->update_sample_size(); });
  } else {
    sharding_->reducer().before_backward(index, count, scaled);
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
  for (const torch::Tensor& g : sharding_->gradients()) {  // every gradient, or this rank's shard (os+grad)
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
  // Under os+grad, from every rank's partial norm (Note [Sharded gradients]).
  const torch::Tensor norm =
      sharding_->global_norm(count == 0 ? torch::zeros({}, torch::kFloat64) : torch::stack(norms).norm());
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
  if (!std::isfinite(result.gnorm)) throw detail::diverged(num_updates_ + 1, result.gnorm);
  if (options_.clip_norm > 0 && result.gnorm > options_.clip_norm) {
    const double scale = options_.clip_norm / (result.gnorm + 1e-6);
    for (auto& [key, group] : groups) at::_foreach_mul_(group.grads, scale);
    result.clipped = true;
  }
}

}  // namespace hetseq
