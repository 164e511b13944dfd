#pragma once
/// --zero-sharding as one interface: what the Controller calls in each update to reduce the gradients,
/// step this rank's part, and gather the parameters, and a checkpoint's part of the optimizer state.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "hetseq/reduce/gradient_reducer.h"
#include "hetseq/optim/optimizer.h"
#include "hetseq/shard/zero_sharding.h"

namespace hetseq {

/// How the parameters, gradients and optimizer state are spread over the ranks, as the update sees it
/// (one per --zero-sharding choice: NoSharding, OptimizerStateSharding, GradientSharding, ParameterSharding; make_sharding_strategy in
/// sharding_factory.h picks one). The Controller owns one and,
/// in each update, after the backward passes that the reducer's hooks watch, calls reduce(), then
/// (after dividing and clipping the reduced gradients) step() and gather(), every rank at the same
/// point. The Checkpointer asks it for state_piece(); a resume from a sharded checkpoint goes through
/// load_state(). See Note [Sharded optimizer state].
class ShardingStrategy {
 public:
  virtual ~ShardingStrategy() = default;

  /// The --zero-sharding choice it implements.
  virtual ZeroSharding mode() const = 0;
  /// The optimizer that the LR schedule, the hyper-parameters, zero_grad() and a checkpoint's optimizer
  /// entries see: over every parameter (under `os` a ShardedOptimizer, which keeps state for its shard).
  virtual optim::Optimizer& optimizer() = 0;
  /// The gradient reducer whose hooks the Controller arms around each update's backward passes.
  virtual GradientReducer& reducer() = 0;

  /// 1. After the update's last backward: the reduced gradients where step() reads them. `none`, `os`:
  /// every rank holds the sum over the ranks of every gradient (GradientReducer::finish_update).
  virtual void reduce() = 0;
  /// 2. Steps this rank's part of the parameters with the divided, clipped gradients: all of them
  /// (`none`), or its shard (`os`).
  virtual void step() = 0;
  /// 3. Every rank's updated parameters to every rank: a collective under `os` (ShardGather), nothing
  /// under `none`.
  virtual void gather() = 0;

  /// The reduced gradients this rank holds after reduce(), in parameter order: every parameter's that has
  /// one (`none`, `os`), or views of its shard of the flat gradient space (`os+grad`). The Controller
  /// divides, measures and clips these.
  virtual std::vector<torch::Tensor> gradients();
  /// The global norm from `local`, the norm of gradients() (float64, a scalar): `local` itself where every
  /// rank holds every gradient; a collective under `os+grad` (the square root of the sum of the ranks'
  /// squares), which every rank calls at the same point.
  virtual torch::Tensor global_norm(const torch::Tensor& local) { return local; }

  /// Whether every rank must run as many forward and backward passes as the others, a rank without samples
  /// running a stand-in (samples 0 and 1 of the data, its loss times 0: Note [Stand-in passes]): under `full`,
  /// whose units are gathered around every pass (Note [Sharded parameters]).
  virtual bool needs_stand_ins() const { return false; }
  /// The passes every rank runs in this update, from this rank's `mine`: a collective (the most of any
  /// rank) where needs_stand_ins(), `mine` otherwise.
  virtual int64_t passes(int64_t mine) { return mine; }

  /// Before a save or the resume check, on every rank: a collective under `full` that gathers the whole
  /// model unit by unit, kept (on the CPU) where `keep`; nothing where every rank holds the whole model.
  virtual void collect_model(bool keep) { (void)keep; }
  /// Before the resume check, on every rank: as collect_model(true), but under `full` keeps each parameter's
  /// CRC-32 (an int64 tensor of one element) instead of its values, so that no rank holds the whole model
  /// (Note [Sharded parameters], "The resume check"); model_tensors then gives those.
  virtual void collect_model_digests() { collect_model(true); }
  /// The model's tensors for a checkpoint, by name (parameters, then buffers; CPU copies): the model's own,
  /// or under `full` what collect_model(true) gathered.
  virtual std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model);

  /// This rank's part of the optimizer's buffers for its shard file in a checkpoint (aliasing the live
  /// buffers), or nullopt where the checkpoint keeps the whole state (optimizer().state()). See Note
  /// [Sharded optimizer state in checkpoints].
  virtual std::optional<optim::StatePiece> state_piece() const = 0;
  /// Restores a sharded checkpoint's optimizer state: `scalars` ("lr", "num_steps", "num_params") from
  /// the checkpoint, the buffers read by range from `pieces` (this rank's range: all of it under
  /// `none`). Throws hetseq::InputError as Optimizer::load_state() and StateSource::read_range().
  virtual void load_state(const std::map<std::string, torch::Tensor>& scalars, const optim::StateSource& pieces) = 0;
};

}  // namespace hetseq
