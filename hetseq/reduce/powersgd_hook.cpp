#include "hetseq/reduce/bucket_hook.h"

#include <utility>

#include "hetseq/reduce/powersgd.h"

namespace hetseq {

PowerSgdHook::PowerSgdHook(c10::intrusive_ptr<c10d::ProcessGroup> group, std::shared_ptr<detail::CommClock> clock,
                           std::shared_ptr<PowerSgd> powersgd)
    : BucketHook(std::move(group), std::move(clock)), powersgd_(std::move(powersgd)) {}

// powersgd: Note [PowerSGD]. Its bytes on the wire depend on its shapes; the bucket's are counted.
c10::intrusive_ptr<c10::ivalue::Future> PowerSgdHook::runHook(c10d::GradBucket& bucket) {
  at::Tensor buffer = bucket.getBufferRef();
  const auto index = static_cast<int>(bucket.getIndex());
  const int64_t bytes = buffer.numel() * static_cast<int64_t>(buffer.element_size());
  return reduce(index, bytes, /*device_span=*/true,
                [&] { return powersgd_->reduce(index, buffer, bucket.getGradients()); }, "");
}

}  // namespace hetseq
