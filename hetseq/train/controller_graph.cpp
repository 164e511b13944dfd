// The Controller's updates from a CUDA graph (--cuda-graph): Note [CUDA-graph updates].
#include <optional>
#include <string>
#include <utility>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/train/controller.h"
#include "hetseq/train/controller_detail.h"

namespace hetseq {
namespace {

/// Why a graph cannot hold the task's sample size: `now` (update `update`) has the shape and sample count of the
/// `seen` one (an earlier update of the task on the graph's path) and another sample size (Note [Values frozen
/// at capture]); nothing where it can.
std::optional<std::string> sample_size_varies(const std::optional<std::pair<FrozenValues, int64_t>>& seen,
                                              const FrozenValues& now, int64_t update) {
  if (!seen || seen->first.fields != now.fields || seen->first.num_samples != now.num_samples ||
      seen->first.sample_size == now.sample_size) {
    return std::nullopt;
  }
  return fmt::format("not captured: the task's sample size, the gradients' divisor, changed between batches of one "
                     "shape and sample count ({} at update {}, {} at update {}), and a graph would freeze it",
                     seen->first.sample_size, seen->second, now.sample_size, update);
}

}  // namespace

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
//   (Note [Reading an update late]), and the optimizer step (below). The graph's inputs are static device tensors that each replay first
//   copies its batch into; its outputs (the statistics, the norm) live in the graph's memory and are copied to
//   the host after each replay as an eager update's are.
// - order: the first kGraphWarmUps (3) fitting updates run eagerly on the capture stream (cuBLAS's and cuDNN's
//   lazy set-up happens there, outside a capture, the optimizer makes its state, the allocator settles); the
//   cache is emptied, the next is captured (in thread-local mode: the loader's threads pin memory meanwhile)
//   and then replayed; every later one is replayed. A batch of another shape (the short last batch of an epoch) trains
//   eagerly in between; the line that says so comes once.
// - dropout: the update's seed is set before each replay; the graph reads the CUDA generator's seed and offset
//   when it is replayed, so each update draws its own masks.
// - the optimizer step: captured too where the optimizer splits it into a host part and kernels that read
//   their numbers from device tensors (Optimizer::use_split_step; Adam switches to device scalars, Note [Adam
//   from device scalars]): the host part (the counts, the step size from the learning rate and the count,
//   epsilon, filled into those tensors) runs before each replay, the kernels in it (Note [The step in a CUDA
//   graph]). Its fused kernel would take the step size and epsilon as host numbers, which a graph freezes.
//   Other optimizers, and sharded ones, step eagerly after the replay.
// - the host statistics (sample_size, ...) are those of the captured update: the task's contract for static
//   shapes is that they depend on the batch's shape only (BERT counts its masked tokens on the device then).
//   The values a replay depends on are checked before each one (Note [Values frozen at capture]).
// - falling back: a capture that throws anything (an operation not allowed while capturing, a failing end of the
//   capture), a task whose sample size changes within one shape, and a value frozen at the capture that changed
//   before a replay each drop the graph with one line saying why; that update and every later one train eagerly,
//   and their results are not `replayed`.
// - tests: the capture object is an interface (GraphCapture, ControllerOptions::graph_capture); a CPU test gives the
//   Controller a double that records its calls and replays by running the captured work again
//   (tests/train/test_graph_states.cpp).

bool Controller::fits_graph(const std::vector<Batch>& micro_batches) {
  const Batch& batch = micro_batches.front();
  bool fits = micro_batches.size() == 1 && !batch.empty();
  // The shapes only: a batch of the captured shape with another sample count is a changed sample size, which
  // replay_update turns the graph off for (Note [Values frozen at capture]).
  if (fits && graph_state_ == GraphState::kReplay) fits = field_shapes(batch) == graph_frozen_.fields;
  if (!fits && !graph_shape_told_) {
    graph_shape_told_ = true;
    log::info("[cuda-graph] update {} has {} micro-batch(es) of {} samples, not one of the captured shape: it and "
              "any other such update train uncaptured",
              num_updates_ + 1, micro_batches.size(), batch.num_samples);
  }
  return fits;
}

FrozenValues Controller::graph_values(const Batch& batch, double sample_size) {
  FrozenValues values;
  values.fields = field_shapes(batch);
  values.num_samples = batch.num_samples;
  values.sample_size = sample_size;
  values.clip_norm = options_.clip_norm;
  values.gradients = data_pointers(sharding_->gradients());
  values.parameters = data_pointers(model_->parameters());
  if (graph_steps_) values.optimizer_state = data_pointers(sharding_->optimizer().step_tensors());
  return values;
}

void Controller::graph_off(const std::string& why) {
  graph_state_ = GraphState::kOff;
  // The tensors in the graph's memory go first, then the graph and its memory pool.
  graph_batch_ = Batch();
  graph_tensors_.clear();
  graph_norm_ = torch::Tensor();
  graph_ = nullptr;
  log::warn("[cuda-graph] {}; this update and every later one train uncaptured", why);
}

UpdateResult Controller::warm_up_update(const std::vector<Batch>& micro_batches) {
  UpdateResult result;
  graph_->warm_up([&] { result = eager_update(micro_batches); });
  // The task ran on this shape: its sample size must be the one it gave the shape before (Note [Values frozen at
  // capture]).
  const FrozenValues seen = graph_values(micro_batches.front(), sum_or(result.sums, "sample_size"));
  if (const auto varies = sample_size_varies(graph_seen_, seen, num_updates_)) {
    graph_off(*varies);
    return result;
  }
  graph_seen_.emplace(seen, num_updates_);
  if (++graph_warm_ups_ >= kGraphWarmUps) graph_state_ = GraphState::kCapture;
  return result;
}

UpdateResult Controller::capture_update(const Batch& batch) {
  {
    torch::NoGradGuard no_grad;
    graph_batch_ = Batch();
    graph_batch_.num_samples = batch.num_samples;
    for (const auto& [name, tensor] : batch.fields) graph_batch_.fields.emplace(name, tensor.clone());
  }
  model_->train();
  torch::manual_seed(detail::update_seed(options_.seed, num_updates_, options_.rank));
  // The work reaches nothing on this stack: a capture object may keep it (a test's double replays by running it
  // again).
  auto work = [this] {
    sharding_->optimizer().zero_grad();
    LogSums local;
    LogTensors local_tensors;
    bool called = false;
    const Task::Backward backward = [&](const StepOutput& step) {
      detail::add_step(local, local_tensors, step);
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
    // The step's kernels; its host part runs before each replay (Note [The step in a CUDA graph]).
    if (graph_steps_) sharding_->optimizer().run_step();
    graph_host_log_ = std::move(local);
    graph_tensors_ = std::move(local_tensors);
    graph_norm_ = late_norm_;
  };
  std::optional<std::string> failed;
  try {
    graph_->capture(work);
  } catch (const c10::Error& e) {
    failed = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failed = e.what();
  } catch (...) {
    failed = "an exception that is not a std::exception";
  }
  if (failed) {
    graph_off(fmt::format("not captured: the update could not be recorded ({})", *failed));
    return eager_update({batch});
  }
  graph_frozen_ = graph_values(batch, sum_or(graph_host_log_, "sample_size"));  // the divisor the graph holds
  if (const auto varies = sample_size_varies(graph_seen_, graph_frozen_, num_updates_ + 1)) {
    graph_off(*varies);
    return eager_update({batch});
  }
  graph_state_ = GraphState::kReplay;
  log::info("[cuda-graph] update {} captured: {} samples a batch, replayed from now on", num_updates_ + 1,
            batch.num_samples);
  return replay_update(batch);
}

UpdateResult Controller::replay_update(const Batch& batch) {
  // See Note [Values frozen at capture]: the sample size before a replay is the one its sample count gives.
  if (const auto changed = changed_value(graph_frozen_, graph_values(batch, graph_frozen_.sample_size))) {
    graph_off(fmt::format("update {} is not replayed, since a value frozen at the capture changed: {}",
                          num_updates_ + 1, *changed));
    return eager_update({batch});
  }
  meters_.train_wall.start();
  model_->train();
  torch::manual_seed(detail::update_seed(options_.seed, num_updates_, options_.rank));
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : graph_batch_.fields) tensor.copy_(batch.fields.at(name), /*non_blocking=*/true);
  }
  UpdateResult result;
  result.loss_scale = 1.0;
  result.replayed = true;
  sharding_->reducer().before_forward();
  channel_->start_update(graph_host_log_, graph_tensors_, stop_vote_);  // a world of one: stacked after the replay
  // The count, the learning rate and epsilon of this update's step into the tensors its kernels read: before the
  // replay, which runs those kernels (Note [The step in a CUDA graph]).
  if (graph_steps_) sharding_->optimizer().prepare_step();
  {
    const TraceSpan span(tracer_.get(), "graph_replay");
    graph_->replay();
  }
  finish_round(result);
  late_norm_ = graph_norm_;
  result.gnorm = std::nan("");
  result.late = true;
  if (!graph_steps_) {
    const TraceSpan span(tracer_.get(), "optimizer");
    sharding_->step();
    sharding_->gather();
  }
  end_update(result);
  return result;
}

}  // namespace hetseq
