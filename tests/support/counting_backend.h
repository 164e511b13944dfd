#pragma once
// A c10d backend that counts the collectives asked of the backend it wraps, for claims such as "no
// statistics round trip after backward" that must be checked from outside the code that makes them.
// Test code (in namespace hetseq, as the tests name it): the library only offers the place to put it,
// ProcessGroupOptions::wrap_backend.

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace hetseq {

/// One collective as it was asked of the backend.
struct CollectiveRecord {
  std::string op;          // "allreduce", "allgather", "broadcast", ... (c10d's method names)
  c10::ScalarType dtype;   // of the first input tensor
  int64_t numel = 0;       // elements of this rank's input tensors
  int64_t bytes = 0;       // bytes of this rank's input tensors
};

/// Forwards every call to `inner` unchanged and records each collective, in the order it was asked
/// for, under a mutex (the reducer launches buckets from autograd's thread while the training thread
/// starts statistics). Recording costs one lock and one small push per collective.
/// count_collectives() puts one in front of a group's backend, through ProcessGroupOptions::wrap_backend.
class CountingBackend : public c10d::Backend {
 public:
  explicit CountingBackend(c10::intrusive_ptr<c10d::Backend> inner);

  /// Every collective recorded so far, oldest first.
  std::vector<CollectiveRecord> records() const;
  /// How many collectives were recorded so far.
  size_t count() const;

  const std::string getBackendName() const override;
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override;

 private:
  void record(const char* op, const std::vector<at::Tensor>& inputs);

  c10::intrusive_ptr<c10d::Backend> inner_;
  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> records_;
};

/// The counting backend in front of `group`'s CPU backend (under the --debug-collectives checks, where the group
/// has them), or nullptr when the group was made without count_collectives().
CountingBackend* counting_backend(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

/// A CountingBackend in front of `backend`: what ProcessGroupOptions::wrap_backend takes.
c10::intrusive_ptr<c10d::Backend> count_collectives(c10::intrusive_ptr<c10d::Backend> backend);

}  // namespace hetseq
