#include "hetseq/data/batch.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "hetseq/core/error.h"

namespace hetseq {

// Note [Batches to the device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On a CUDA rank the BatchLoader collates each batch and copies it into pinned host memory on its own
// thread (the collate of the next update overlaps the current one, see UpdateStream), and the training
// loop sends every micro-batch of an update to the device as soon as the update's batches are there:
// - each tensor is copied with non_blocking=true on a side stream from the device's stream pool, so the
//   host does not wait and the copy runs beside the kernels already queued on the compute stream (the
//   previous update's optimizer step, typically);
// - the compute stream waits on an event recorded on the side stream after the copies, so no kernel of
//   the update reads a batch before it has arrived;
// - each device tensor is recorded as used on the compute stream (record_stream): it was allocated on the
//   side stream, and without the record the caching allocator could hand its memory to the next copy
//   while the compute stream still reads it. The pinned source is safe too: the host allocator keeps a
//   pinned block until the copies that read it have finished.
// The values are the same bytes as a plain copy, so training is bit-for-bit the same as with unpinned
// batches (tests/cuda/test_cuda_batch_copy.cpp). On CPU ranks nothing is pinned (pinning needs CUDA) and
// to(kCPU) shares the tensors. An unpinned batch goes to a CUDA device on the current stream, as before.
// The controller's own to() then finds the batch on its device and does nothing.

const torch::Tensor& Batch::at(const std::string& name) const {
  auto it = fields.find(name);
  HETSEQ_ASSERT(it != fields.end(), "batch has no field '{}'", name);
  return it->second;
}

bool Batch::pinned() const {
  bool any = false;
  for (const auto& [name, tensor] : fields) {
    if (tensor.numel() == 0) continue;  // nothing to copy (and no memory to pin)
    if (!tensor.is_pinned()) return false;
    any = true;
  }
  return any;
}

Batch Batch::pin_memory() const {
  Batch out;
  out.num_samples = num_samples;
  for (const auto& [name, tensor] : fields) {
    out.fields.emplace(name, tensor.numel() == 0 || tensor.is_pinned() ? tensor : tensor.pin_memory());
  }
  return out;
}

Batch Batch::to(const torch::Device& device) const {
  Batch out;
  out.num_samples = num_samples;
  if (!device.is_cuda() || !pinned()) {
    for (const auto& [name, tensor] : fields) {
      // A tensor already there is shared without a call: a conversion to the CPU is a host read to
      // Note [Counting operators], even when there is nothing to copy.
      out.fields.emplace(name, tensor.device() == device ? tensor : tensor.to(device, /*non_blocking=*/tensor.is_pinned()));
    }
    return out;
  }
  // See Note [Batches to the device].
  const c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Device target = device.has_index() ? device : impl.getDevice();
  const c10::Stream compute = impl.getStream(target);
  const c10::Stream side = impl.getStreamFromGlobalPool(target);
  {
    const c10::StreamGuard on_side(side);
    for (const auto& [name, tensor] : fields) out.fields.emplace(name, tensor.to(target, /*non_blocking=*/true));
  }
  c10::Event copied(target.type());
  copied.record(side);
  copied.block(compute);
  for (const auto& [name, tensor] : out.fields) {
    if (tensor.numel() > 0) impl.recordDataPtrOnStream(tensor.storage().data_ptr(), compute);
  }
  return out;
}

}  // namespace hetseq
