#pragma once
// The CUDA tests (this folder, tag [cuda], names starting "CUDA:") run where this process sees a CUDA
// device and are skipped elsewhere, visibly: Catch2 v2 has no SKIP, so a skipped test passes with a warning
// that starts with kCudaSkipMarker, and ctest reports it as skipped (the SKIP_REGULAR_EXPRESSION that
// tests/cuda/mark_skipped.cmake sets on them). scripts/gpu_check.sh --run runs them on a lent GPU.

#include <string>

#include <catch2/catch.hpp>
#include <torch/torch.h>

namespace hetseq::test {

/// The start of a skipped CUDA test's warning; ctest's skip pattern (tests/cuda/mark_skipped.cmake).
inline constexpr const char* kCudaSkipMarker = "[cuda] skipped:";

/// Whether this process sees at least one CUDA device; when it does not, a Catch warning that says so and
/// why (the caller returns at once).
inline bool cuda_or_skip() {
  if (torch::cuda::is_available()) return true;
#ifdef HETSEQ_WITH_CUDA
  const char* why = "LibTorch has CUDA, but torch::cuda::is_available() is false: no GPU or no driver";
#else
  const char* why = "this build's LibTorch has no CUDA";
#endif
  WARN(kCudaSkipMarker << " no CUDA device (" << why << "); it runs where one is, e.g. scripts/gpu_check.sh --run");
  return false;
}

}  // namespace hetseq::test
