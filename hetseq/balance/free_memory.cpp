#include "hetseq/balance/free_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#ifdef HETSEQ_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {
namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<int64_t> read_number(const std::string& path) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  try {
    size_t used = 0;
    const long long v = std::stoll(*text, &used);
    return static_cast<int64_t>(v);
  } catch (const std::exception&) {
    return std::nullopt;  // "max": no limit
  }
}

// What the process's cgroup still allows: limit - usage, when there is a limit.
std::optional<int64_t> cgroup_room() {
  const auto limit2 = read_number("/sys/fs/cgroup/memory.max");
  const auto usage2 = read_number("/sys/fs/cgroup/memory.current");
  if (limit2 && usage2) return std::max<int64_t>(0, *limit2 - *usage2);
  const auto limit1 = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  const auto usage1 = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  // cgroup v1 reports "no limit" as a huge number (about 2^63 rounded to the page size).
  if (limit1 && usage1 && *limit1 < (int64_t{1} << 60)) return std::max<int64_t>(0, *limit1 - *usage1);
  return std::nullopt;
}

}  // namespace

namespace detail {
std::optional<int64_t> mem_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}
}  // namespace detail

int64_t free_memory_bytes(const torch::Device& device) {
#ifdef HETSEQ_WITH_CUDA
  if (device.is_cuda()) {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      throw InputError(fmt::format("--memory-budget: cannot read the free memory of {}; give --memory-budget GB",
                                   device.str()));
    }
    return static_cast<int64_t>(free);
  }
#endif
  const auto meminfo = read_text("/proc/meminfo");
  const auto available = meminfo ? detail::mem_available(*meminfo) : std::nullopt;
  if (!available) {
    throw InputError("--memory-budget: cannot read MemAvailable from /proc/meminfo; give --memory-budget GB");
  }
  const auto room = cgroup_room();
  return room ? std::min(*available, *room) : *available;
}

}  // namespace hetseq
