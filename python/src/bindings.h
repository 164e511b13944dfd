#pragma once
// The parts of hetseq._C, each bound by its own file; bindings.cpp defines the module and calls them.

#include <torch/csrc/utils/pybind.h>

namespace hetseq::python {

/// hetseq._C.Checkpoint, save_checkpoint, load_checkpoint and the model helpers (checkpoint_binding.cpp).
void bind_checkpoint(pybind11::module_& m);
/// hetseq._C.CostWindow and solve_split, the balancer's parts (balance_binding.cpp).
void bind_balance(pybind11::module_& m);
/// hetseq._C.plan_shards, ShardGather and the other parts of the sharded optimizer state (shard_binding.cpp).
void bind_shard(pybind11::module_& m);
/// hetseq._C.train: a registered C++ task trained in this process (train_binding.cpp).
void bind_train(pybind11::module_& m);

}  // namespace hetseq::python
