#include "hetseq/train/precision.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <ATen/autocast_mode.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

// Note [Float16 on CPUs with AVX512-FP16]
// On a CPU with AVX512-FP16 (Intel Sapphire Rapids and later), LibTorch 2.11's oneDNN picks its float16
// kernels for convolutions under --fp16 autocast, and their backward pass is pathologically slow: one
// 32->64-channel 3x3 convolution of 64 Fashion-MNIST images took 8.9-13.8 s to differentiate, against
// 0.55-0.85 s with oneDNN capped below that instruction set (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16,
// AVX512_CORE or AVX2) and 0.04 s in float32; the forward pass and float16 matrix products were not
// affected (measured with one thread on this project's 2-core Xeon, 2026-11-26). CPUs without
// AVX512-FP16 (the AMD EPYC this project used before) take the capped path anyway. So a CPU rank under
// --fp16 caps oneDNN at AVX512_CORE_BF16, which leaves float32 and bfloat16 kernels as they are on such
// a CPU except for AMX, which only bfloat16 and int8 use and which --fp16 does not ask for. The values
// computed do not change: the capped kernels compute the same float16 convolution. A user who sets the
// variable keeps their choice.

bool avoid_slow_cpu_fp16_kernels() {
  if (std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr || std::getenv("DNNL_MAX_CPU_ISA") != nullptr) return false;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool fp16 = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    std::string word;
    while (words >> word) fp16 = fp16 || word == "avx512_fp16";
    break;
  }
  if (!fp16) return false;
  return ::setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", 0) == 0;
}

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::kFloat32: return "fp32";
    case Precision::kFloat16: return "fp16";
    case Precision::kBFloat16: return "bf16";
  }
  return "?";
}

std::optional<torch::ScalarType> autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFloat16: return torch::kHalf;
    case Precision::kBFloat16: return torch::kBFloat16;
    case Precision::kFloat32: break;
  }
  return std::nullopt;
}

void check_precision_supported(Precision precision, const torch::Device& device, const std::string& flag) {
  if (precision == Precision::kFloat32) return;
  if (!at::autocast::is_autocast_available(device.type())) {
    throw UsageError(fmt::format("{}: LibTorch has no autocast for device {}; leave the flag out to train in fp32",
                                 flag, device.str()));
  }
}

AutocastGuard::AutocastGuard(const torch::Device& device, Precision precision)
    : type_(device.type()),
      previous_enabled_(at::autocast::is_autocast_enabled(type_)),
      previous_dtype_(at::autocast::get_autocast_dtype(type_)) {
  const std::optional<torch::ScalarType> dtype = autocast_dtype(precision);
  at::autocast::set_autocast_enabled(type_, dtype.has_value());
  if (dtype) at::autocast::set_autocast_dtype(type_, *dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(type_, previous_enabled_);
  at::autocast::set_autocast_dtype(type_, previous_dtype_);
}

}  // namespace hetseq
