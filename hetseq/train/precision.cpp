#include "hetseq/train/precision.h"

#include <ATen/autocast_mode.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

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
