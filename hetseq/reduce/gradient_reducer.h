#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "hetseq/checkpoint/training_state.h"
#include "hetseq/task/task.h"

namespace hetseq {

class Tracer;

/// How the gradient reduction of the last update went.
struct ReductionTiming {
  int64_t buckets = 0;   // bucket allreduces started
  int64_t bytes = 0;     // gradient bytes each rank sent into them
  double comm_s = 0;     // from the first bucket's start to the last bucket's completion
  double busy_s = 0;     // of which at least one bucket's allreduce was in flight
  double exposed_s = 0;  // of which after the last bucket was ready: time backward spent waiting on the network
};

/// The step of an update that sums the gradients of all ranks, and only the gradients: the statistics,
/// the stop vote and every other message go through the CollectiveChannel (Note [Communication roles]).
/// The Controller calls it around the backward passes of an update; a distributed implementation
/// starts communication during backward. See Note [Weighted averaging].
class GradientReducer {
 public:
  /// The update's sample count summed over all ranks, which a comm hook may read during backward (Note
  /// [Comm hooks]); the Controller gives the channel's.
  using SampleCount = std::function<double()>;

  virtual ~GradientReducer() = default;
  /// Once per update, before its first forward pass; every rank calls it at the same point. A
  /// distributed implementation makes the model's buffers (running statistics) rank 0's here, as
  /// DDP's broadcast_buffers does.
  virtual void before_forward() {}
  /// Between the forward and the backward pass of micro-batch `index` of `count` in this update, with
  /// its loss. Implementations communicate only for the last one (gradient accumulation, HetSeq's
  /// no_sync). Every rank runs the same number of micro-batches (see Note [Data plan]). `samples`
  /// (null: 1) gives the update's global sample count for the comm hooks.
  virtual void before_backward(int64_t index, int64_t count, const torch::Tensor& loss,
                               const SampleCount& samples = nullptr) {}
  /// After the last backward: turns every parameter's gradient into the sum of the gradients of all
  /// ranks. A parameter that no rank used in the update (where the implementation allows that) is left
  /// without a gradient (undefined), so that the optimizer, the norm and clipping skip it, as under
  /// PyTorch's DDP.
  virtual void finish_update() = 0;
  /// The last update's reduction: buckets, bytes and times (zeros for one process); `exposed_s` is the
  /// seconds backward spent waiting on communication after its last gradient was ready.
  virtual ReductionTiming last_timing() const { return {}; }
  /// Spans of the buffer broadcast, each bucket's allreduce and the wait at the end of backward go to `tracer` (null: none). Shared, because the backend's threads may still
  /// complete a bucket after an error has unwound the caller. See Note [Tracing].
  virtual void set_tracer(std::shared_ptr<Tracer> tracer) {}
  /// The parameters of each gradient bucket in reduction order, [bucket][index among the parameters
  /// that take a gradient]; empty where there are no buckets. Checkpoints keep it, because with three
  /// or more ranks the layout changes the sums' rounding (Note [Bucketed reduction]).
  virtual std::vector<std::vector<int64_t>> bucket_layout() const { return {}; }
  /// The comm hook's state between updates that a checkpoint keeps (PowerSGD's), gathered to rank 0:
  /// a collective that every rank calls at the same point between updates (Checkpointer::save); none
  /// without such a hook. See Note [PowerSGD in checkpoints].
  virtual std::optional<PowerSgdState> gather_comm_hook_state() { return std::nullopt; }
  /// On resume, before the first update: hands the checkpoint's comm hook state (absent in files
  /// written without one) to the hook; returns whether a hook took it. `source` names the file.
  virtual bool load_comm_hook_state(const std::optional<PowerSgdState>& state, const std::string& source) {
    return false;
  }
};

/// One process: the local gradient and sums are already the totals.
class LocalReducer final : public GradientReducer {
 public:
  void finish_update() override {}
};

}  // namespace hetseq
