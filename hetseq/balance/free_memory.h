#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/types.h>

namespace hetseq {

/// The memory free for this rank on `device`, in bytes: on a CUDA device the device's free memory
/// (cudaMemGetInfo); on the CPU the smaller of /proc/meminfo's MemAvailable and what the process's
/// cgroup and its ancestors still allow (memory.max - memory.current, cgroup v2 or v1; Note [Room in a
/// cgroup]). The default of --memory-budget.
/// Throws hetseq::InputError when nothing can be read (no /proc/meminfo).
int64_t free_memory_bytes(const torch::Device& device);

namespace detail {
/// MemAvailable of a /proc/meminfo text, in bytes (nullopt when absent).
std::optional<int64_t> mem_available(const std::string& meminfo);
}  // namespace detail

}  // namespace hetseq
