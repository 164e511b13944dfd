#pragma once
/// How a model lets --zero-sharding full hold its parameters unit by unit: it names its units (its
/// layers, or groups of them) and runs each through the UnitRunner it is given. See Note [Sharded
/// parameters] (hetseq/shard/unit_gather.cpp).

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace hetseq {

/// Runs one unit's forward pass with its parameters present: under --zero-sharding full it gathers the
/// unit's parameters from the ranks that hold them before `forward`, frees them after, and gathers them
/// again before the unit's backward pass. A model calls it through run_unit().
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  /// Runs `forward` (the unit's forward pass, returning the unit's one output) for unit `unit`, an index
  /// into ShardableModel::units(). A forward pass runs the units in index order, each once; the runner
  /// throws hetseq::InternalError naming both units otherwise (every rank must gather the same units in
  /// the same order).
  virtual torch::Tensor run(size_t unit, const std::function<torch::Tensor()>& forward) = 0;
};

/// A model (a torch::nn::Module that also derives from this) whose parameters --zero-sharding full may
/// hold unit by unit. A model that does not derive from it trains under full too, with all of its
/// parameters whole on every rank between the forward passes (only the gradients and the optimizer state
/// sharded, as under os+grad).
class ShardableModel {
 public:
  virtual ~ShardableModel() = default;
  /// The units, in the order the forward pass runs them: submodules whose parameters are used only
  /// inside that unit's forward (its one output carries them on). The parameters of no unit (embeddings,
  /// heads, a weight shared between units) stay whole on every rank.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> units() = 0;
  /// The runner that forward() passes each unit through from now on (null: run them plainly).
  virtual void set_unit_runner(std::shared_ptr<UnitRunner> runner) = 0;
};

/// Runs unit `unit`'s `forward` through `runner`, or plainly where there is none.
inline torch::Tensor run_unit(const std::shared_ptr<UnitRunner>& runner, size_t unit,
                              const std::function<torch::Tensor()>& forward) {
  return runner ? runner->run(unit, forward) : forward();
}

}  // namespace hetseq
