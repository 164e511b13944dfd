#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>

#include "hetseq/reduce/comm_hook.h"
#include "hetseq/reduce/ddp_options.h"
#include "hetseq/reduce/powersgd.h"
#include "hetseq/reduce/shm_reduce.h"
#include "hetseq/reduce/gradient_reducer.h"

namespace c10d {
class Logger;
class Reducer;
}  // namespace c10d

namespace hetseq {

namespace detail {
struct CommClock;
}  // namespace detail
class BucketHook;

/// Rank 0's `buffers` (a model's running statistics) to every rank of `group`, in place: what a reducer's
/// before_forward() does each update (DDP's broadcast_buffers). Throws hetseq::PeerError naming `rank` of
/// `world_size` when a peer is lost.
void broadcast_model_buffers(const c10::intrusive_ptr<c10d::ProcessGroup>& group, std::vector<torch::Tensor>& buffers,
                             int64_t rank, int64_t world_size);

/// Data-parallel gradient reduction over a c10d process group, driven by LibTorch's own c10d::Reducer
/// (the engine behind PyTorch's DistributedDataParallel): gradients are summed over the ranks in
/// buckets whose allreduces start during backward. See Note [Bucketed reduction] and
/// Note [Weighted averaging]. The Controller calls it; the training driver builds it.
class DistributedReducer final : public GradientReducer {
 public:
  /// Broadcasts `model`'s parameters and buffers from rank 0 (so all ranks start identical), checks
  /// that every rank has the same parameter shapes (hetseq::InputError otherwise), then builds the
  /// buckets. `model` must outlive the reducer. Every rank of `group` must construct one at the same
  /// point.
  DistributedReducer(torch::nn::Module& model, c10::intrusive_ptr<c10d::ProcessGroup> group, DdpOptions options);
  ~DistributedReducer() override;
  DistributedReducer(const DistributedReducer&) = delete;
  DistributedReducer& operator=(const DistributedReducer&) = delete;

  /// With broadcast_buffers, copies rank 0's buffers (running statistics) into every rank's model, in
  /// one coalesced broadcast; no collective when the model has no buffers. The Controller calls it
  /// once per update, before the first forward pass.
  void before_forward() override;
  /// For the last micro-batch of an update (`index == count - 1`) arms the gradient hooks, so that
  /// the following backward reduces the gradients; earlier micro-batches only accumulate locally.
  void before_backward(int64_t index, int64_t count, const torch::Tensor& loss,
                       const SampleCount& samples = nullptr) override;
  /// After the last backward: every parameter's gradient is the sum over all ranks (with
  /// find_unused_parameters, a parameter no rank used is left without a gradient, undefined, as
  /// under DDP).
  /// Throws hetseq::InputError when a parameter got no gradient without find_unused_parameters.
  void finish_update() override;

  /// Timing of the last update's gradient reduction.
  ReductionTiming last_timing() const override { return timing_; }
  void set_tracer(std::shared_ptr<Tracer> tracer) override;
  /// Size in bytes of each bucket, `[bucket]` in reduction order (the layout can change once, after
  /// the first update; see Note [Bucketed reduction]).
  std::vector<int64_t> bucket_sizes() const;
  std::vector<std::vector<int64_t>> bucket_layout() const override;
  /// PowerSgd::gather_state with --ddp-comm-hook powersgd; none otherwise.
  std::optional<PowerSgdState> gather_comm_hook_state() override;
  /// PowerSgd::load_state with --ddp-comm-hook powersgd (logged when the checkpoint has no state for
  /// it); false otherwise.
  bool load_comm_hook_state(const std::optional<PowerSgdState>& state, const std::string& source) override;
  /// Whether every parameter's gradient lives in the reducer's shared-memory segment, where backward writes it
  /// and the sum is made in place (Note [Buckets in shared memory]); false without one, or for a gradient in
  /// memory of its own. For tests and benchmarks, after an update.
  bool gradients_in_shared_memory() const;
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }

  /// Whether ranks may sit out updates (Note [Sitting out]): not with find_unused_parameters, whose used-
  /// parameter counts the c10d::Reducer allreduces over the whole group, nor with PowerSGD, whose error
  /// feedback every rank keeps update by update.
  bool sits_out_supported() const {
    return !options_.find_unused_parameters && options_.comm_hook != CommHook::kPowerSgd;
  }
  /// The ranks that take part in the updates from now on, in rank order, rank 0 first, and `group`, a
  /// process group of exactly those ranks (null: the run's group, when all take part). The buckets, the
  /// buffers' broadcast and the shared-memory sums go over them only. Every rank calls it at the same point
  /// between updates (a rank outside `members` too); one outside runs no update until a later call names it.
  /// Note [Sharing an update].
  void set_members(const std::vector<int64_t>& members, c10::intrusive_ptr<c10d::ProcessGroup> group);

 private:
  /// With find_unused_parameters: resets the gradients of the parameters that no rank used in this
  /// update. See Note [Bucketed reduction].
  void forget_unused_gradients();
  // The constructor's steps after the parameters are collected and broadcast, in order.
  /// --shared-memory-reduce: shm_, where the ranks can sum `buckets` ([bucket][param]) through a segment; throws
  /// hetseq::UsageError where `on` cannot be honoured. A collective where wanted. Note [Shared-memory reduction].
  void open_shared_memory(const std::vector<std::vector<size_t>>& buckets, int64_t cap_bytes);
  std::string off_cpu_refusal() const;
  bool shared_memory_wanted(bool all_cpu, const std::string& off_cpu_error) const;
  /// reducer_ and logger_ over params_ in `buckets` ([bucket][param]).
  void build_c10d_reducer(std::vector<std::vector<size_t>> buckets, int64_t cap_bytes, int64_t first_cap_bytes);
  /// The comm hook (and PowerSGD's state) on reducer_; throws hetseq::UsageError for powersgd with
  /// find_unused_parameters.
  void register_bucket_hook();

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::intrusive_ptr<c10d::ProcessGroup> update_group_;  // the ranks that take part (set_members); group_ at first
  BucketHook* hook_ = nullptr;                           // owned by reducer_
  DdpOptions options_;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  std::vector<torch::Tensor> params_;          // [param] the reduced parameters, in registration order
  std::vector<std::string> param_names_;       // [param] qualified names
  std::vector<torch::Tensor> buffers_;         // [buffer] the model's buffers, once each (broadcast_buffers)
  std::shared_ptr<PowerSgd> powersgd_;          // --ddp-comm-hook powersgd; shared with the comm hook
  std::shared_ptr<SharedMemoryReduce> shm_;     // --shared-memory-reduce; shared with the comm hook
  std::shared_ptr<c10d::Reducer> reducer_;
  std::shared_ptr<c10d::Logger> logger_;        // the Reducer's error reports and bucket statistics
  std::shared_ptr<detail::CommClock> clock_;    // written by the comm hook
  GradientReducer::SampleCount samples_;       // this update's global sample count, for the comm hook
  int64_t num_buckets_ = 0;
  bool armed_ = false;                          // before_backward armed this update's hooks
  ReductionTiming timing_;
  std::shared_ptr<Tracer> tracer_;
};

}  // namespace hetseq
