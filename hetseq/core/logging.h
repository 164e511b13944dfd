#pragma once
/// Logging for hetseq: one line per message on stderr, with a component prefix such as
/// `[rendezvous]`, `[reducer]`, `[checkpoint]`. Rank 0 logs by default; other ranks log when
/// enable_all_ranks() was called (--log-all-ranks). spdlog does the writing (behind this header,
/// so that its {fmt} never meets LibTorch's).

#include <string>
#include <utility>
#include <vector>

#include "hetseq/core/format.h"

namespace hetseq::log {

enum class Level { kDebug, kInfo, kWarn, kError };

/// Sets this process's rank, shown in every line when several ranks log.
void set_rank(int64_t rank);
/// Lets every rank log, not just rank 0.
void enable_all_ranks(bool enabled = true);
/// Lowest level written (default kInfo).
void set_level(Level level);
/// Writes one already formatted line. Prefer the formatting helpers below.
void write(Level level, const std::string& message);

/// From now on, also keeps a copy of every line that is written (after the rank and level filters,
/// without time and level), until end_capture(). For tests that check what a component logged.
void begin_capture();
/// Stops keeping lines and returns those kept since begin_capture().
std::vector<std::string> end_capture();

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace hetseq::log
