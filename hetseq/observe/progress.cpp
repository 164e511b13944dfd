#include "hetseq/observe/progress.h"

#include <nlohmann/json.hpp>
#include "hetseq/core/format.h"

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"

namespace hetseq {
namespace {

std::string format_value(const Stat& s) {
  if (!s.list.empty()) return fmt::format("{}", fmt::join(s.list, "/"));
  if (!s.reals.empty()) return fmt::format("{:.3g}", fmt::join(s.reals, "/"));
  if (s.integer) return fmt::format("{:.0f}", s.value);
  if (s.name == "lr") return fmt::format("{:.4g}", s.value);
  return fmt::format("{:.3f}", s.value);
}

std::string simple_line(int64_t epoch, const std::string& tag, int64_t i, int64_t total,
                        const std::vector<Stat>& stats, const std::string& subset = "") {
  std::string head = fmt::format("| epoch {:03d}", epoch);
  if (tag == "train") head += fmt::format(": {:>6} / {}", i, total);
  else if (!subset.empty()) head += fmt::format(" | {} on '{}' subset", tag, subset);
  else head += fmt::format(" | {}", tag);
  std::string body;
  for (const auto& s : stats) {
    if (!s.json_only) body += fmt::format(" | {} {}", s.name, format_value(s));
  }
  return head + body;
}

}  // namespace

std::string json_record(const LogRecord& record) {
  nlohmann::ordered_json j;
  j["epoch"] = record.epoch;
  j["tag"] = record.tag;
  for (const auto& s : *record.stats) {
    if (!s.list.empty()) j[s.name] = s.list;
    else if (!s.reals.empty()) j[s.name] = s.reals;
    else j[s.name] = s.integer ? nlohmann::ordered_json(static_cast<int64_t>(s.value)) : nlohmann::ordered_json(s.value);
  }
  if (!record.subset.empty()) j["subset"] = record.subset;
  if (record.updates_in_epoch > 0) {
    j["update_in_epoch"] = record.update_in_epoch;
    j["updates_in_epoch"] = record.updates_in_epoch;
  }
  return j.dump();
}

LogFormat parse_log_format(const std::string& text) {
  if (text == "none") return LogFormat::kNone;
  if (text == "simple") return LogFormat::kSimple;
  if (text == "json") return LogFormat::kJson;
  throw UsageError(fmt::format("--log-format: '{}' is not one of none, simple, json", text));
}

std::string to_string(LogFormat format) {
  switch (format) {
    case LogFormat::kNone: return "none";
    case LogFormat::kSimple: return "simple";
    case LogFormat::kJson: return "json";
  }
  HETSEQ_ASSERT(false, "unknown LogFormat");
  return "";
}

ProgressLogger::ProgressLogger(LogFormat format, bool progress_bar, int64_t log_interval, std::FILE* out)
    : format_(format), bar_(progress_bar && format != LogFormat::kJson), log_interval_(log_interval), out_(out) {}

void ProgressLogger::emit(int64_t epoch, const std::string& tag, int64_t i, int64_t total,
                          const std::vector<Stat>& stats, bool log_line) {
  if (log_line) write_sinks(LogRecord{epoch, tag, "", &stats, i, total});
  if (bar_) {
    const int width = 30;
    const int filled = total > 0 ? static_cast<int>(width * i / total) : 0;
    std::string shown;
    for (const auto& s : stats) {
      if (s.name == "loss" || s.name == "lr" || s.name == "ups" || s.name == "wps") {
        shown += fmt::format(" {}={}", s.name, format_value(s));
      }
    }
    fmt::print(out_, "\repoch {:03d} {:3d}%|{}{}| {}/{}{}\x1b[K", epoch, total > 0 ? 100 * i / total : 0,
               std::string(filled, '#'), std::string(width - filled, ' '), i, total, shown);
    std::fflush(out_);
    bar_open_ = true;
    return;
  }
  if (!log_line || format_ == LogFormat::kNone) return;
  if (format_ == LogFormat::kJson) {
    fmt::print(out_, "{}\n", json_record(LogRecord{epoch, tag, "", &stats, i, total}));
  } else {
    fmt::print(out_, "{}\n", simple_line(epoch, tag, i, total, stats));
  }
  std::fflush(out_);
}

void ProgressLogger::log(int64_t epoch, const std::string& tag, const std::vector<Stat>& stats,
                         const std::string& subset) {
  finish_bar();
  const LogRecord record{epoch, tag, subset, &stats};
  write_sinks(record);
  if (format_ == LogFormat::kNone) return;
  if (format_ == LogFormat::kJson) {
    fmt::print(out_, "{}\n", json_record(record));
  } else {
    fmt::print(out_, "{}\n", simple_line(epoch, tag, 0, 0, stats, subset));
  }
  std::fflush(out_);
}

void ProgressLogger::record(int64_t epoch, const std::string& tag, const std::vector<Stat>& stats) {
  const LogRecord record{epoch, tag, "", &stats};
  write_sinks(record);
  if (format_ != LogFormat::kJson) return;
  finish_bar();
  fmt::print(out_, "{}\n", json_record(record));
  std::fflush(out_);
}

// A sink that fails (a full disk under --json-log) is dropped with a warning: a log output is not
// worth stopping the run for, and the console still has the figures.
void ProgressLogger::write_sinks(const LogRecord& record) {
  for (auto it = sinks_.begin(); it != sinks_.end();) {
    try {
      (*it)->write(record);
      ++it;
    } catch (const std::exception& e) {
      finish_bar();
      log::warn("[log] {}; that output stops here, training goes on", e.what());
      it = sinks_.erase(it);
    }
  }
}

void ProgressLogger::finish_bar() {
  if (bar_open_) {
    fmt::print(out_, "\n");
    std::fflush(out_);
    bar_open_ = false;
  }
}

}  // namespace hetseq
