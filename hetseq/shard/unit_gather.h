#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "hetseq/shard/accumulator_hooks.h"
#include "hetseq/shard/shard_plan.h"
#include "hetseq/task/model_units.h"

namespace hetseq {

/// [param] the unit of each of `model`'s parameters (its order), an index into ShardableModel::units(), or
/// -1 for a parameter of no unit; all -1 for a model that is not a ShardableModel. Throws
/// hetseq::InternalError naming the parameter when two units share it.
std::vector<int64_t> parameter_units(torch::nn::Module& model);

/// How `params` fall into units (`unit_of`, as parameter_units gives it): the units, the elements of the
/// largest, and the elements in no unit (the root).
struct UnitSizes {
  int64_t units = 0;
  int64_t largest = 0;
  int64_t root = 0;
};
UnitSizes unit_sizes(const std::vector<torch::Tensor>& params, const std::vector<int64_t>& unit_of);

/// --zero-sharding full's parameters: each rank keeps its shard of the flat parameter space (shard()),
/// and a unit's parameters exist whole only while the unit runs its forward or its backward pass, gathered
/// from the ranks that hold them; the parameters of no unit (the root) stay whole. Every parameter
/// becomes a view of its unit's (or the root's) flat buffer, whose storage is refilled and emptied in
/// place, so that what autograd saved of a parameter reads the gathered values again in backward. The
/// gathers run on their own process group, the next unit's launched while the current one computes. See
/// Note [Sharded parameters].
class UnitGather final : public UnitRunner {
 public:
  /// `params` every parameter (the model's order, contiguous, one dtype and device), `unit_of` [param]
  /// its unit (an index into the model's units) or -1 for the root, `plan` [rank] the shard plan over the
  /// flat space, `group` the gathers' own process group (the same ranks as the plan). Copies this rank's
  /// shard out of the parameters and frees every unit's storage; every rank builds it alike.
  UnitGather(std::vector<torch::Tensor> params, const std::vector<int64_t>& unit_of, std::vector<ShardRange> plan,
             c10::intrusive_ptr<c10d::ProcessGroup> group);
  ~UnitGather() override;
  UnitGather(const UnitGather&) = delete;
  UnitGather& operator=(const UnitGather&) = delete;

  torch::Tensor run(size_t unit, const std::function<torch::Tensor()>& forward) override;

  /// This rank's shard of the flat parameter space: what the optimizer steps (float, [shard numel]).
  const torch::Tensor& shard() const { return shard_; }
  /// After a step: every rank's updated shard of the root's parameters to every rank.
  void gather_root();
  /// Frees every unit still gathered (one whose backward did not reach all of its parameters).
  void release_all();
  /// Every parameter's value, whole, in the model's order ([param], on the CPU, fresh copies), gathered
  /// unit by unit: a collective; `keep` false on the ranks that only take part (they get an empty vector).
  std::vector<torch::Tensor> whole_parameters(bool keep);
  /// [param] the CRC-32 of each parameter's bytes (int64, one element, on the CPU), gathered unit by unit as
  /// whole_parameters does but holding one unit at a time: a collective; the same on every rank that holds the
  /// same model.
  std::vector<torch::Tensor> parameter_digests();

  size_t num_units() const { return units_.size() - 1; }
  /// Bytes of parameters this rank holds now, read from the storages: between passes its shard and the root's
  /// parameters (and any unit still gathered).
  int64_t held_bytes() const;

 private:
  /// Gathers the units one at a time (the root as it is) and calls `visit` with each parameter while its unit is
  /// whole: a collective.
  void visit_whole(const std::function<void(size_t param)>& visit);
  // Where a unit's elements lie: [first, first + numel) of the flat space, at `offset` of its buffer.
  struct Interval {
    int64_t first = 0;
    int64_t numel = 0;
    int64_t offset = 0;
  };
  enum class State { kFree, kPending, kPresent };
  struct Unit {
    std::vector<size_t> params;
    std::vector<Interval> intervals;
    int64_t numel = 0;
    torch::Tensor flat;  // every parameter of the unit is a view of it; its storage emptied when free
    State state = State::kFree;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    int64_t grads_left = 0;  // in a backward pass: its parameters whose gradient is not accumulated yet
    bool in_backward = false;
  };

  void allocate(Unit& u);
  void free(Unit& u);
  void launch(size_t unit);
  void wait(size_t unit);
  /// Gathers `unit` (at once, or waits for its prefetch).
  void acquire(size_t unit);
  /// Launches `unit`'s gather if it is free; nothing for an index out of range.
  void prefetch(int64_t unit);
  void release(size_t unit);
  void on_backward(size_t unit);
  void on_gradient(size_t unit);

  std::vector<torch::Tensor> params_;
  std::vector<ShardRange> plan_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  int64_t rank_ = 0;
  std::vector<Unit> units_;  // the model's units, then the root (last)
  torch::Tensor shard_;
  size_t next_forward_ = 0;  // the unit a forward pass runs next
  AccumulatorHooks hooks_;  // on the units' parameters: the last one's frees its unit
};

}  // namespace hetseq
