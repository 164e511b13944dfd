#pragma once
// The CUDA tests (this folder, tag [cuda], names starting "CUDA:") run where this process sees a CUDA
// device and are skipped elsewhere, visibly: Catch2 v2 has no SKIP, so a skipped test passes with a warning
// that starts with kCudaSkipMarker, and ctest reports it as skipped (the SKIP_REGULAR_EXPRESSION that
// tests/cuda/mark_skipped.cmake sets on them). scripts/gpu_check.sh --run runs them on a lent GPU.

#include <filesystem>
#include <string>

#include <catch2/catch.hpp>
#include <torch/torch.h>

namespace hetseq::test {

/// The start of a skipped CUDA test's warning; ctest's skip pattern (tests/cuda/mark_skipped.cmake).
inline constexpr const char* kCudaSkipMarker = "[cuda] skipped:";

/// Whether this process sees at least one CUDA device; when it does not, a Catch warning that says so and
/// why (the caller returns at once).
inline bool cuda_or_skip() {
  // Without an NVIDIA driver's device node (Linux, or WSL's /dev/dxg) there is nothing for CUDA to find: the
  // test says so at once, where asking LibTorch first loads the CUDA libraries (about 2 s a test here).
  const bool nodes = std::filesystem::exists("/dev/nvidiactl") || std::filesystem::exists("/dev/nvidia0") ||
                     std::filesystem::exists("/dev/dxg");
  if (nodes && torch::cuda::is_available()) return true;
#ifdef HETSEQ_WITH_CUDA
  const char* why = nodes ? "LibTorch has CUDA, but torch::cuda::is_available() is false: no GPU or no driver"
                          : "no /dev/nvidiactl, /dev/nvidia0 or /dev/dxg: no NVIDIA driver here";
#else
  const char* why = "this build's LibTorch has no CUDA";
#endif
  WARN(kCudaSkipMarker << " no CUDA device (" << why << "); it runs where one is, e.g. scripts/gpu_check.sh --run");
  return false;
}

}  // namespace hetseq::test
