#include "hetseq/reduce/bucket_hook.h"

namespace hetseq {

// none: the float32 bucket is allreduced as it is (Note [Comm hooks]).
c10::intrusive_ptr<c10::ivalue::Future> SumHook::runHook(c10d::GradBucket& bucket) {
  std::vector<at::Tensor> tensors{bucket.getBufferRef()};
  const auto index = static_cast<int>(bucket.getIndex());
  const int64_t bytes = tensors[0].numel() * static_cast<int64_t>(tensors[0].element_size());
  Tracer::DeviceSpan* on_device = nullptr;
  const auto tracer = launch(index, bytes, /*device_span=*/true, &on_device);
  const auto start = detail::CommClock::Clock::now();
  return complete(state_->allreduce(tensors)->getFuture(), index, bytes, start, tracer, on_device, "", nullptr);
}

}  // namespace hetseq
