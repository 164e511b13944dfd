#include "hetseq/reduce/bucket_hook.h"

#include <utility>

namespace hetseq {

CastHook::CastHook(c10::intrusive_ptr<c10d::ProcessGroup> group, std::shared_ptr<detail::CommClock> clock,
                   CommHook kind, std::function<double()> sample_size)
    : BucketHook(std::move(group), std::move(clock)),
      kind_(kind),
      sample_size_(std::move(sample_size)),
      how_(", --ddp-comm-hook " + to_string(kind)) {}

// fp16, bf16: divided by the update's global sample count S, cast, allreduced, cast back and multiplied by S
// (Note [Comm hooks]).
c10::intrusive_ptr<c10::ivalue::Future> CastHook::runHook(c10d::GradBucket& bucket) {
  at::Tensor buffer = bucket.getBufferRef();
  double scale = sample_size_ ? sample_size_() : 1;
  if (!(scale > 0)) scale = 1;
  std::vector<at::Tensor> tensors{(scale == 1 ? buffer : buffer / scale).to(wire_type(kind_))};
  const auto index = static_cast<int>(bucket.getIndex());
  const int64_t bytes = tensors[0].numel() * static_cast<int64_t>(tensors[0].element_size());
  return reduce(index, bytes, /*device_span=*/true, [&] { return state_->allreduce(tensors)->getFuture(); },
                how_.c_str(), [buffer, scale](c10::ivalue::Future& done) {
                    buffer.copy_(done.value().toTensorVector()[0]);
                    if (scale != 1) buffer.mul_(scale);
                    return c10::IValue(std::vector<at::Tensor>{buffer});
                  });
}

}  // namespace hetseq
