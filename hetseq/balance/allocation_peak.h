#pragma once

#include <cstdint>
#include <functional>

namespace hetseq {

/// The most bytes that `work` held allocated at one time through LibTorch's allocators (the CPU
/// allocator and CUDA's caching allocator), counted from zero when it starts: what `work` needs on top
/// of the memory that already exists. The session measures one forward and backward with it for the
/// memory check (Note [Memory that a rank needs]). Counts the allocations of the calling thread and of
/// the threads LibTorch hands its thread-local state to (autograd's engine, at::launch), not those made
/// inside OpenMP workers of an intra-op parallel region (kernels allocate their outputs before those).
/// A block allocated before `work` and freed inside it is not subtracted.
int64_t peak_allocated_bytes(const std::function<void()>& work);

}  // namespace hetseq
