#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace hetseq {

// Note [Counting operators]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// What an update costs the host shows in two counts that LibTorch itself can report, through a
// RecordFunction callback on the dispatcher (the hook its profiler uses), not through counters that hetseq
// keeps by hand:
// - ATen operators: every operator the dispatcher runs in the callback's scope (nested ones included, as a
//   profiler trace lists them), and apart those called from outside any operator (top level). On a GPU most
//   of them launch a kernel, so the counts stand in for kernel launches on a machine without one; the top-level
//   count is the closer where a CPU kernel loops over operators that a GPU fuses (foreach calls).
// - Host reads: the operators that make the host wait for the device's result: `_local_scalar_dense`
//   (`item()`, a tensor used as a bool), `nonzero`, `masked_select`, the `unique` family (their output
//   size is a device value), and a conversion or copy to the CPU that does not ask for `non_blocking`
//   (`to`, `_to_copy`, `copy_` with a CPU destination). A read nested in another read (`to` runs
//   `_to_copy`, which runs `copy_`) counts once. On a CPU-only machine a `.to(kCPU)` of a CPU tensor still
//   passes through the dispatcher as `aten::to`, so a blocking read put back into the update is seen there
//   too, before anyone runs it on a GPU; a conversion of a CPU tensor that changes its dtype (autocast's casts
//   name the CPU as their device) is no read. Only reads that the program calls count, directly or through
//   `item` and `is_nonzero`: a read inside another operator is that operator's implementation on that device
//   (LibTorch's fused AdamW on the CPU reads each parameter's step count with `item`; its CUDA kernel reads it
//   on the device). HETSEQ_HOST_READ_TRACE=1 prints each counted read with the operators it runs inside.
// The callback is thread-local: it sees the thread that made the counter and, through LibTorch's
// propagation of thread-local state, the autograd engine's threads while they run that thread's backward;
// not the data loader's threads.

/// Counts the ATen operators and host reads (Note [Counting operators]) of the thread that constructs it,
/// from construction to destruction. One counter at a time per process.
class OpCounter {
 public:
  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  int64_t ops() const { return ops_.load(std::memory_order_relaxed); }
  /// The operators called by the program or by autograd, not from inside another operator: closer to the
  /// kernels launched on a GPU, where a CPU fallback (a foreach call looping over tensors) counts once.
  int64_t top_level_ops() const { return top_ops_.load(std::memory_order_relaxed); }
  int64_t host_reads() const { return host_reads_.load(std::memory_order_relaxed); }
  /// Starts both counts from zero again.
  void reset();

  /// Counts the thread that constructs it too, into `counter`, until it is destroyed (with the autograd
  /// threads that run its backward): ranks as threads in one process, each counted into one total.
  class OnThread {
   public:
    explicit OnThread(OpCounter& counter);
    ~OnThread();
    OnThread(const OnThread&) = delete;
    OnThread& operator=(const OnThread&) = delete;

   private:
    uint64_t handle_ = 0;  // at::CallbackHandle
  };

 private:
  friend struct OpCounterAccess;
  std::atomic<int64_t> ops_{0};
  std::atomic<int64_t> top_ops_{0};
  std::atomic<int64_t> host_reads_{0};
  uint64_t handle_ = 0;  // at::CallbackHandle
};

}  // namespace hetseq
