#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

namespace hetseq {

/// Post-hooks on parameters' gradient accumulators: a callback each time a parameter's gradient has been
/// accumulated into .grad (after every node that differentiates through it has run). The hooks are removed
/// when it is destroyed. The ShardReducer launches its buckets from them, the UnitGather frees its units.
class AccumulatorHooks {
 public:
  AccumulatorHooks() = default;
  ~AccumulatorHooks();
  AccumulatorHooks(const AccumulatorHooks&) = delete;
  AccumulatorHooks& operator=(const AccumulatorHooks&) = delete;

  /// Hooks `param`'s accumulator (it must require a gradient; throws hetseq::InternalError naming `what`
  /// otherwise) with `on_accumulated`.
  void add(const torch::Tensor& param, std::function<void()> on_accumulated, const std::string& what);

 private:
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // each with one hook of ours
  std::vector<uintptr_t> keys_;
};

}  // namespace hetseq
