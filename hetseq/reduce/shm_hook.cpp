#include "hetseq/reduce/bucket_hook.h"

#include <utility>

#include "hetseq/reduce/shm_reduce.h"

namespace hetseq {

SharedMemoryHook::SharedMemoryHook(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                   std::shared_ptr<detail::CommClock> clock, std::shared_ptr<SharedMemoryReduce> shm)
    : BucketHook(std::move(group), std::move(clock)), shm_(std::move(shm)) {}

// Note [Shared-memory reduction]: its PeerError names the ranks that did not arrive and comes out as it is.
c10::intrusive_ptr<c10::ivalue::Future> SharedMemoryHook::runHook(c10d::GradBucket& bucket) {
  at::Tensor buffer = bucket.getBufferRef();
  const auto index = static_cast<int>(bucket.getIndex());
  const int64_t bytes = buffer.numel() * static_cast<int64_t>(buffer.element_size());
  return reduce(index, bytes, /*device_span=*/false, [&] { return shm_->allreduce_bucket_async(buffer, index); },
                nullptr);
}

}  // namespace hetseq
