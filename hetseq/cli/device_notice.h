#pragma once
/// What hetseq-train says about the device it trains on when the command line did not choose it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace hetseq::cli {

/// The warning for a run without --cpu that trains on the CPU because no CUDA device is visible, naming
/// what was looked for: CUDA_VISIBLE_DEVICES in `environment`, `visible_devices` (torch::cuda's count)
/// and whether LibTorch has CUDA at all (`libtorch_has_cuda`). None when --cpu was given (`cpu`) or a
/// device is visible. hetseq-train logs it once, as rank 0.
std::optional<std::string> cpu_fallback_warning(bool cpu, int64_t visible_devices,
                                                const std::map<std::string, std::string>& environment,
                                                bool libtorch_has_cuda);

/// cpu_fallback_warning for this process: its --cpu, its environment and the devices LibTorch sees.
std::optional<std::string> cpu_fallback_warning_here(bool cpu);

}  // namespace hetseq::cli
