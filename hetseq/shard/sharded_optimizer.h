#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hetseq/shard/shard_gather.h"
#include "hetseq/shard/shard_plan.h"
#include "hetseq/shard/shard_report.h"
#include "hetseq/optim/optimizer.h"
#include "hetseq/optim/registry.h"

namespace hetseq {

/// What ShardedOptimizer needs: this rank's memory budget and how shards are cut and gathered.
struct ShardedOptimizerOptions {
  int64_t budget_bytes = 0;  // --memory-budget (default: the free memory; see free_memory_bytes)
  int64_t alignment = 16;    // shard boundaries are multiples of this many elements
  GatherMethod gather = GatherMethod::kBroadcastPerRank;  // See Note [Gathering uneven shards]
  /// Whether gather() gathers the updated shards into the parameters (`os`, `os+grad`); under `full` the
  /// units gather what they need (UnitGather), and no gather buffer is kept.
  bool gather_parameters = true;
};

/// A collective over `group`: every rank's memory budget, [rank], exchanged on `device` (NCCL wants CUDA
/// tensors). ShardedOptimizer::create and Python's hetseq.ShardedOptimizer call it before plan_shards.
/// Throws hetseq::PeerError when a peer is lost.
std::vector<int64_t> exchange_budgets(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int64_t budget_bytes,
                                      const torch::Device& device);

/// A collective over `group`: every rank's ShardReport, [rank], from each rank's own `mine`, exchanged on
/// `device`. Throws hetseq::PeerError when a peer is lost.
std::vector<ShardReport> exchange_shard_reports(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                                const ShardReport& mine, const torch::Device& device);

/// --zero-sharding os: the configured optimizer (same class, same kernels) runs on this rank's shard
/// of the parameters only, so it keeps state for that shard only; the updated shards are then gathered
/// to every rank. OptimizerStateSharding (the `os` ShardingStrategy) drives it for the Controller; as an
/// Optimizer, step() is step_shard() then gather(). See Note [Sharded optimizer state].
class ShardedOptimizer final : public optim::Optimizer {
 public:
  /// Called once, on every rank, after the first step with every rank's report ([rank]).
  using Report = std::function<void(const std::vector<ShardReport>&)>;

  /// A collective over `group`: the ranks exchange their budgets, every rank computes the same plan
  /// (plan_shards) and builds `make` over the views of its shard. Throws hetseq::InputError (from
  /// plan_shards) when a budget is not positive or too small for one aligned piece.
  static std::unique_ptr<ShardedOptimizer> create(std::vector<torch::Tensor> params,
                                                  const optim::OptimizerFactory& make,
                                                  c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                  ShardedOptimizerOptions options, Report report = {});

  std::string name() const override { return shard_->name(); }
  /// Steps this rank's shard and gathers the shards: step_shard(), then gather().
  void step() override;
  /// Steps this rank's shard only, with views of the reduced, clipped gradients as its gradients.
  void step_shard();
  /// A collective: every rank's updated shard of the parameters to every rank (ShardGather); after the
  /// first, it reports the plan (every rank's ShardReport, one more allgather).
  void gather();
  std::map<std::string, double> hyperparameters() const override { return shard_->hyperparameters(); }
  void set_hyperparameter(const std::string& name, double value) override { shard_->set_hyperparameter(name, value); }
  int64_t state_buffers() const override { return shard_->state_buffers(); }

  /// lr, num_steps and num_params: the buffers are each rank's own, in its shard file (state_piece()).
  std::map<std::string, torch::Tensor> state() const override;
  /// Loads an unsharded-form state (as written by an unsharded run, or gathered from every rank's shard):
  /// each rank takes its shard's slices, so a checkpoint resumes on any world size, budgets or
  /// --zero-sharding. Throws hetseq::InputError when the parameter count differs, or as the shard
  /// optimizer's load_state().
  void load_state(const std::map<std::string, torch::Tensor>& state) override;
  /// Loads a sharded checkpoint's state: this rank reads its own shard's range from `pieces` (the shard
  /// files it overlaps, whatever world size and budgets wrote them). Throws as load_state() and as
  /// StateSource::read_range(). See Note [Sharded optimizer state in checkpoints].
  void load_state(const std::map<std::string, torch::Tensor>& scalars, const optim::StateSource& pieces);
  /// This rank's shard of the buffers, per parameter (aliasing the live buffers): what its shard file keeps.
  optim::StatePiece state_piece() const;

  /// Under os+grad: the gradients of the views ([view], each a view's size), which step_shard() reads
  /// instead of the parameters' (freed by then) and the plan's report counts.
  void use_gradients(std::vector<torch::Tensor> grads);
  /// Where each view lies in the parameters ([view]).
  const std::vector<ShardSlice>& slices() const { return slices_; }
  /// Under full: the views become views of `shard` (this rank's shard of the flat space, holding the same
  /// values), which the step then updates in place; the parameters' storage is the units' (UnitGather).
  void use_parameter_shard(const torch::Tensor& shard);
  /// Under full: what the plan's report counts as this rank's parameter bytes (its shard and the root).
  void count_parameters_with(std::function<int64_t()> held) { held_param_bytes_ = std::move(held); }
  /// The plan's report, once (gather() calls it; under full the strategy does).
  void report_once() {
    if (!reported_) report_plan();
  }

  /// This rank's shard of the flat parameter space.
  ShardRange shard() const { return plan_[static_cast<size_t>(group_->getRank())]; }
  /// Every rank's shard. [rank]
  const std::vector<ShardRange>& plan() const { return plan_; }
  /// Bytes of the optimizer state this rank holds (its buffers' tensors).
  int64_t state_bytes() const;

 protected:
  std::vector<std::string> buffer_names() const override { return {}; }

 private:
  ShardedOptimizer(std::vector<torch::Tensor> params, std::vector<ShardSlice> slices, std::vector<torch::Tensor> views,
                   std::unique_ptr<optim::Optimizer> shard, std::vector<ShardRange> plan,
                   std::unique_ptr<ShardGather> gather, c10::intrusive_ptr<c10d::ProcessGroup> group,
                   int64_t budget_bytes, Report report);
  void report_plan();

  std::vector<ShardSlice> slices_;   // [shard tensor] where each view lies in the parameters
  std::vector<torch::Tensor> views_;  // [shard tensor] views of the parameters, the shard optimizer's parameters
  std::unique_ptr<optim::Optimizer> shard_;
  std::vector<ShardRange> plan_;          // [rank]
  std::unique_ptr<ShardGather> gather_;  // null under full
  std::function<int64_t()> held_param_bytes_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  int64_t budget_bytes_;
  Report report_;
  bool reported_ = false;
  std::vector<torch::Tensor> shard_grads_;  // [view] use_gradients(); empty: the parameters' gradients
};

}  // namespace hetseq
