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

// Note [Room in a cgroup]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A process's memory cgroup is named in /proc/self/cgroup ("0::/a/b" under cgroup v2, "N:memory:/a/b" under
// v1), relative to the hierarchy's mount (/sys/fs/cgroup, /sys/fs/cgroup/memory). A job scheduler or a
// container puts the process into such a group, and any ancestor of it may hold a lower limit, so the room is
// the smallest limit - usage over the group and its ancestors up to the mount: reading the mount's own files
// alone reads the root's, which has no limit. A group whose directory is not visible (a cgroup namespace
// whose root is the group itself shows "/") is read from the mount, which is then the group.
std::optional<int64_t> room_along(const std::string& mount, std::string path, const char* limit_file,
                                  const char* usage_file) {
  std::optional<int64_t> room;
  for (;;) {
    const std::string dir = mount + (path == "/" ? "" : path);
    const auto limit = read_number(dir + "/" + limit_file);
    const auto usage = read_number(dir + "/" + usage_file);
    // "max" reads as no number; cgroup v1 says "no limit" with a number near 2^63 (rounded to the page).
    if (limit && usage && *limit < (int64_t{1} << 60)) {
      const int64_t here = std::max<int64_t>(0, *limit - *usage);
      room = room ? std::min(*room, here) : here;
    }
    if (path.empty() || path == "/") return room;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

// What the process's cgroup (and its ancestors) still allow: the smallest limit - usage, when there is a
// limit. See Note [Room in a cgroup].
std::optional<int64_t> cgroup_room() {
  const auto self = read_text("/proc/self/cgroup");
  std::string v1 = "/", v2 = "/";
  if (self) {
    std::istringstream lines(*self);
    std::string line;
    while (std::getline(lines, line)) {
      const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
      if (controllers.empty()) v2 = path;
      std::istringstream names(controllers);
      for (std::string name; std::getline(names, name, ',');) {
        if (name == "memory") v1 = path;
      }
    }
  }
  if (const auto room = room_along("/sys/fs/cgroup", v2, "memory.max", "memory.current")) return room;
  return room_along("/sys/fs/cgroup/memory", v1, "memory.limit_in_bytes", "memory.usage_in_bytes");
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
