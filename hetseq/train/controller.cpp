#include "hetseq/train/controller.h"

#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"

namespace hetseq {
namespace {

void add_into(LogSums& into, const LogSums& from) {
  for (const auto& [k, v] : from) into[k] += v;
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
  if (options_.clip_norm < 0) {
    throw UsageError(fmt::format("--clip-norm: {} is negative; use 0 to turn clipping off", options_.clip_norm));
  }
  check_precision_supported(options_.precision, options_.device, "--" + to_string(options_.precision));
  if (options_.loss_scaling) scaler_ = std::make_unique<DynamicLossScaler>(*options_.loss_scaling);
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

void Controller::set_tracer(std::shared_ptr<Tracer> tracer) {
  tracer_ = tracer;
  reducer_->set_tracer(tracer);
  channel_->set_tracer(std::move(tracer));
}

UpdateResult Controller::train_update(const std::vector<Batch>& micro_batches) {
  HETSEQ_ASSERT(!micro_batches.empty(), "an update with no micro-batches");
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
  reducer_->finish_update();
  UpdateAgreement agreed = channel_->finish_update();
  result.sums = std::move(agreed.sums);
  result.stop_agreed = agreed.stop;
  result.late_stat_rounds = agreed.late_rounds;
  result.reduction = reducer_->last_timing();
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
  ++num_updates_;
  lr_scheduler_->step_update(num_updates_);
  update_meters(result);
  meters_.train_wall.stop();
  return result;
}

void Controller::run_micro_batches(const std::vector<Batch>& micro_batches, double loss_scale, int64_t& host_reads) {
  // [stat name] summed over the non-empty micro-batches before the last (see Note [Empty micro-batches]):
  // what the task knew on the host, and what it computed on the device, added up there until the last
  // backward reads them all at once (Note [Statistics on the device]).
  LogSums local;
  LogTensors local_tensors;
  // A step's statistics into the sums.
  auto add_step = [](LogSums& into, LogTensors& into_tensors, const StepOutput& step) {
    for (const auto& [name, value] : step.log) {
      if (name != "sample_size") into[name] += value;
    }
    into["sample_size"] += step.sample_size;
    add_log_tensors(into_tensors, logged_tensors(step));
  };
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
        if (add_to_host(local, local_tensors)) ++host_reads;
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
// one call divides, one computes the per-tensor norms and one clips; one reduction combines the norms and the
// host reads the result once.
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
  result.gnorm = norm.item<double>();
  ++result.host_reads;
  if (scaler_ && !std::isfinite(result.gnorm)) {
    result.skipped = true;
    return;
  }
  if (!std::isfinite(result.gnorm)) {
    // Stepping would write inf or NaN into every parameter; the run is over either way.
    throw InputError(fmt::format(
        "update {}: the gradient norm is {} on every rank, so the update would ruin the model. The loss diverged "
        "(lower --lr or use --clip-norm), or, with --ddp-comm-hook fp16, the summed gradients overflowed "
        "float16's range on the wire (use --ddp-comm-hook bf16, or --fp16 whose loss scaling skips such updates)",
        num_updates_ + 1, result.gnorm));
  }
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

std::map<std::string, double> Controller::meter_state() const {
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
  meters_.reset_epoch();
  epoch_sums_.clear();
}

std::vector<Stat> Controller::train_stats() const {
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
