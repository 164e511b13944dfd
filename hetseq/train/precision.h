#pragma once

#include <optional>
#include <string>

#include <torch/types.h>

namespace hetseq {

/// The arithmetic of forward passes. Parameters, gradients and optimizer state stay float32 in every
/// mode; the lower-precision modes run the forward pass under LibTorch's autocast, which casts the
/// inputs of matrix products, convolutions and attention to float16 or bfloat16 and keeps reductions,
/// normalisations and losses in float32. See Note [Loss scaling] for why float16 needs a loss scale.
enum class Precision {
  kFloat32,   // no autocast (the default)
  kFloat16,   // --fp16: autocast to float16, with dynamic loss scaling
  kBFloat16,  // --bf16: autocast to bfloat16 (float32's exponent range: no loss scaling)
};

/// "fp32", "fp16" or "bf16".
std::string to_string(Precision precision);

/// The autocast dtype of `precision` (none for kFloat32).
std::optional<torch::ScalarType> autocast_dtype(Precision precision);

/// See Note [Float16 on CPUs with AVX512-FP16]. Where this CPU has AVX512-FP16 and the user has set
/// neither ONEDNN_MAX_CPU_ISA nor DNNL_MAX_CPU_ISA, sets ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 for this
/// process and the processes it starts, and returns true; otherwise changes nothing and returns false.
/// Takes effect only before the process's first oneDNN primitive (its first convolution): the session
/// calls it for --fp16 on a CPU rank before building the model, the test binary at start.
bool avoid_slow_cpu_fp16_kernels();

/// Throws hetseq::UsageError naming `flag` when LibTorch has no autocast for `device`'s type.
void check_precision_supported(Precision precision, const torch::Device& device, const std::string& flag);

/// While it lives, operations on devices of `device`'s type run under autocast to `precision`'s dtype,
/// or with autocast off for kFloat32 (the backward pass inside an autocast forward). Restores the
/// previous setting on destruction and, leaving the outermost autocast region, drops autocast's cache
/// of low-precision weight copies (the next update changes the weights). Guards nest like
/// `torch.autocast` blocks; one thread only.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, Precision precision);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType type_;
  bool previous_enabled_;
  torch::ScalarType previous_dtype_;
};

}  // namespace hetseq
