#include "hetseq/cli/device_notice.h"

#include <torch/cuda.h>

#include "hetseq/core/format.h"
#include "hetseq/world/init_method.h"

namespace hetseq::cli {

std::optional<std::string> cpu_fallback_warning(bool cpu, int64_t visible_devices,
                                                const std::map<std::string, std::string>& environment,
                                                bool libtorch_has_cuda) {
  if (cpu || visible_devices > 0) return std::nullopt;
  const auto it = environment.find("CUDA_VISIBLE_DEVICES");
  const std::string variable =
      it == environment.end() ? "CUDA_VISIBLE_DEVICES unset" : fmt::format("CUDA_VISIBLE_DEVICES='{}'", it->second);
  return fmt::format("[train] no CUDA device visible ({}, torch::cuda::device_count() == {}{}): training on the CPU; "
                     "pass --cpu to silence this",
                     variable, visible_devices, libtorch_has_cuda ? "" : ", this LibTorch is built without CUDA");
}

std::optional<std::string> cpu_fallback_warning_here(bool cpu) {
#ifdef HETSEQ_WITH_CUDA
  constexpr bool kHasCuda = true;
#else
  constexpr bool kHasCuda = false;
#endif
  const int64_t visible = torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  return cpu_fallback_warning(cpu, visible, process_environment(), kHasCuda);
}

}  // namespace hetseq::cli
