#include "support/counting_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>

namespace hetseq {

CountingBackend::CountingBackend(c10::intrusive_ptr<c10d::Backend> inner)
    : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}

void CountingBackend::record(const char* op, const std::vector<at::Tensor>& inputs) {
  CollectiveRecord r;
  r.op = op;
  r.dtype = inputs.empty() ? c10::ScalarType::Undefined : inputs.front().scalar_type();
  for (const auto& t : inputs) {
    r.numel += t.numel();
    r.bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  records_.push_back(std::move(r));
}

std::vector<CollectiveRecord> CountingBackend::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return records_;
}

size_t CountingBackend::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return records_.size();
}

const std::string CountingBackend::getBackendName() const { return inner_->getBackendName(); }
c10::intrusive_ptr<c10d::Backend::Options> CountingBackend::getBackendOptions() { return inner_->getBackendOptions(); }
void CountingBackend::setTimeout(std::chrono::milliseconds timeout) { inner_->setTimeout(timeout); }
void CountingBackend::setSequenceNumberForGroup() { inner_->setSequenceNumberForGroup(); }
uint64_t CountingBackend::getSequenceNumberForGroup() { return inner_->getSequenceNumberForGroup(); }

c10::intrusive_ptr<c10d::Work> CountingBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  record("broadcast", tensors);
  return inner_->broadcast(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  record("allreduce", tensors);
  return inner_->allreduce(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  record("allreduce_coalesced", tensors);
  return inner_->allreduce_coalesced(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  record("reduce", tensors);
  return inner_->reduce(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  record("allgather", inputs);
  return inner_->allgather(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  record("allgather_into_tensor", {input});
  return inner_->_allgather_base(output, input, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  record("allgather_coalesced", inputs);
  return inner_->allgather_coalesced(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  record("allgather_into_tensor_coalesced", inputs);
  return inner_->allgather_into_tensor_coalesced(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  record("gather", inputs);
  return inner_->gather(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  record("scatter", outputs);
  return inner_->scatter(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  record("reduce_scatter", outputs);
  return inner_->reduce_scatter(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  record("reduce_scatter_tensor", {input});
  return inner_->_reduce_scatter_base(output, input, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  record("reduce_scatter_tensor_coalesced", inputs);
  return inner_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  record("alltoall_base", {input});
  return inner_->alltoall_base(output, input, output_splits, input_splits, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  record("alltoall", inputs);
  return inner_->alltoall(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  record("send", tensors);
  return inner_->send(tensors, dst, tag);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  record("recv", tensors);
  return inner_->recv(tensors, src, tag);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  record("recv", tensors);
  return inner_->recvAnysource(tensors, tag);
}
c10::intrusive_ptr<c10d::Work> CountingBackend::barrier(const c10d::BarrierOptions& opts) {
  record("barrier", {});
  return inner_->barrier(opts);
}
void CountingBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  record("barrier", {});
  inner_->monitoredBarrier(opts, wait_all_ranks);
}

c10::intrusive_ptr<c10d::Backend> count_collectives(c10::intrusive_ptr<c10d::Backend> backend) {
  return c10::make_intrusive<CountingBackend>(std::move(backend));
}

CountingBackend* counting_backend(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  if (!group->hasBackends()) return nullptr;
  try {
    c10::intrusive_ptr<c10d::Backend> backend = group->getBackend(c10::DeviceType::CPU);
    // With --debug-collectives the counter sits under the checks: it counts what they pass on.
    if (auto* checked = dynamic_cast<c10d::ProcessGroupWrapper*>(backend.get())) backend = checked->getWrappedPg();
    return dynamic_cast<CountingBackend*>(backend.get());
  } catch (const c10::Error&) {
    return nullptr;  // no CPU backend (an NCCL-only group)
  }
}

}  // namespace hetseq
