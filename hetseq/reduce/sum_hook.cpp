#include "hetseq/reduce/bucket_hook.h"

namespace hetseq {

// none: the float32 bucket is allreduced as it is (Note [Comm hooks]).
c10::intrusive_ptr<c10::ivalue::Future> SumHook::runHook(c10d::GradBucket& bucket) {
  std::vector<at::Tensor> tensors{bucket.getBufferRef()};
  const auto index = static_cast<int>(bucket.getIndex());
  const int64_t bytes = tensors[0].numel() * static_cast<int64_t>(tensors[0].element_size());
  return reduce(index, bytes, /*device_span=*/true, [&] { return state_->allreduce(tensors)->getFuture(); }, "");
}

}  // namespace hetseq
