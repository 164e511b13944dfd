// The spdlog side of hetseq/core/logging.h. Compiled in its own target without LibTorch's include
// paths, so that spdlog sees the system {fmt} it was built with.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace hetseq::log {

enum class Level { kDebug, kInfo, kWarn, kError };

namespace {
std::atomic<int64_t> g_rank{0};
std::atomic<bool> g_all_ranks{false};

std::mutex g_capture_mutex;
std::atomic<bool> g_capturing{false};    // set and cleared under g_capture_mutex
std::vector<std::string> g_captured;     // guarded by g_capture_mutex

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = std::make_shared<spdlog::logger>("hetseq", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("%Y-%m-%d %H:%M:%S | %^%l%$ | %v");
    l->set_level(spdlog::level::info);
    return l;
  }();
  return *instance;
}

spdlog::level::level_enum to_spdlog(Level level) {
  static const spdlog::level::level_enum levels[] = {spdlog::level::debug, spdlog::level::info, spdlog::level::warn,
                                                     spdlog::level::err};
  return levels[static_cast<int>(level)];
}
}  // namespace

void set_rank(int64_t rank) { g_rank = rank; }
void enable_all_ranks(bool enabled) { g_all_ranks = enabled; }

void set_level(Level level) {
  logger().set_level(to_spdlog(level));
}

void write(Level level, const std::string& message) {
  const int64_t rank = g_rank;
  if (rank != 0 && !g_all_ranks && level != Level::kError) return;
  const std::string line = g_all_ranks ? "rank " + std::to_string(rank) + " | " + message : message;
  const spdlog::level::level_enum spd_level = to_spdlog(level);
  if (g_capturing && logger().should_log(spd_level)) {  // no lock on the usual path
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    if (g_capturing) g_captured.push_back(line);
  }
  logger().log(spd_level, line);
}

void begin_capture() {
  std::lock_guard<std::mutex> lock(g_capture_mutex);
  g_capturing = true;
  g_captured.clear();
}

std::vector<std::string> end_capture() {
  std::lock_guard<std::mutex> lock(g_capture_mutex);
  g_capturing = false;
  return std::move(g_captured);
}

}  // namespace hetseq::log
