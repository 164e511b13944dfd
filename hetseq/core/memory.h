#pragma once

namespace hetseq {

// Note [Keeping freed memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A training update allocates its activations and gradients (tens of MB for MNISTNet at batch 64)
// and frees them at its end. With glibc's default, adaptive thresholds, `free` often trims the top of
// the heap back to the kernel, and the next update faults every page in again, zero-filled: 15-18 ms
// of a 90 ms update on the benchmark machine, varying with the process's allocation history (see
// docs/BENCHMARKS.md). A trainer reuses the same sizes every update, so it keeps the memory: blocks
// up to 32 MiB come from the heap, and the heap is not trimmed.

/// Tells the C library to keep freed memory in the process (see Note [Keeping freed memory]).
/// Called once at the start of the drivers, before LibTorch allocates.
void keep_freed_memory();

}  // namespace hetseq
