#pragma once
// The parts of hetseq._C, each bound by its own file; bindings.cpp defines the module and calls them.

#include <torch/csrc/utils/pybind.h>

#include <memory>

namespace hetseq::python {

// Note [Process groups at exit]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A bound object that holds a process group (the Reducer, a ShardGather) keeps it alive past the script's
// dist.destroy_process_group(), so Gloo's worker threads used to live on into the interpreter's finalization.
// A worker that then dropped the last reference to a tensor that Python had seen needed the GIL to release
// its PyObject; a thread that asks for the GIL during finalization is ended by pthread_exit, whose unwinding
// met a noexcept frame: "terminate called without an active exception", an abort after a run that had
// finished (seen in 1 of about 4 runs of tests/python). So (1) these objects are deleted with the GIL
// released (ReleaseGilDelete, as LibTorch deletes its own process groups), since the last reference to a
// group joins its worker threads, which may be waiting for the GIL; and (2) hetseq's Python objects drop
// them and their process group at exit (atexit, python/hetseq/_holders.py), before finalization, so that a
// group destroyed by the script is joined while its threads can still take the GIL (5 of 5 runs passed).
// (3) LibTorch itself kept the default group past destroy_process_group() once an optimizer had been built:
// torch.optim imports torch.distributed.nn.functional (through torch._dynamo), whose functions' default
// argument `group=group.WORLD` is evaluated at that import and then holds the group. The abort came back
// in CI (1 run of tests/python), on rank 0, whose last collective was the checkpoint's all_reduce of a
// Python tensor. `import hetseq` imports that module first, while no group exists, so that its defaults
// are None (python/hetseq/_world_defaults.py); tests/python/test_ddp.py checks that no Gloo thread is left.
// (4) It came back once more (1 in about 8 runs of the hetseq-eval test, on rank 1): a Python tensor given to the
// checkpoint's all_reduce, released last by a Gloo worker after the script ended. The package's own agreements
// now use tensors made in C++ (_C.any_rank), which a worker can release without the GIL.
template <typename T>
struct ReleaseGilDelete {
  void operator()(T* p) const {
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release release;
      delete p;
    } else {
      delete p;
    }
  }
};
template <typename T>
using ReleaseGilPtr = std::unique_ptr<T, ReleaseGilDelete<T>>;

/// hetseq._C.Checkpoint, save_checkpoint, load_checkpoint and the model helpers (checkpoint_binding.cpp).
void bind_checkpoint(pybind11::module_& m);
/// hetseq._C.CostWindow and solve_split, the balancer's parts (balance_binding.cpp).
void bind_balance(pybind11::module_& m);
/// hetseq._C.plan_shards, ShardGather and the other parts of the sharded optimizer state (shard_binding.cpp).
void bind_shard(pybind11::module_& m);
/// hetseq._C.train: a registered C++ task trained in this process (train_binding.cpp).
void bind_train(pybind11::module_& m);

}  // namespace hetseq::python
