#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace hetseq {

/// How statistics are printed (--log-format).
enum class LogFormat { kNone, kSimple, kJson };

/// Parses --log-format (`none`, `simple`, `json`); throws hetseq::UsageError otherwise.
LogFormat parse_log_format(const std::string& text);

/// One logged value: a number, an integer counter printed without decimals, or (when `list` is not
/// empty) a list of integers such as the per-rank split.
struct Stat {
  std::string name;
  double value;
  bool integer = false;
  std::vector<int64_t> list = {};
};

/// Prints training statistics: `--log-format simple` as aligned text for people, `json` as one JSON
/// object per line on stdout (the stats' names as keys, plus `epoch` and `tag`: `train`, `valid`,
/// `train_epoch`), `none` not at all. On a terminal, and unless --no-progress-bar, an in-place
/// progress bar shows the position in the epoch between log lines.
class ProgressLogger {
 public:
  ProgressLogger(LogFormat format, bool progress_bar, int64_t log_interval, std::FILE* out = stdout);

  /// Called after every update of an epoch: draws the bar, and logs `stats` every log_interval
  /// updates (stats are computed only then, through `make_stats`).
  template <class MakeStats>
  void on_update(int64_t epoch, int64_t i, int64_t total, MakeStats&& make_stats) {
    const bool log_now = log_interval_ > 0 && i % log_interval_ == 0;
    if (!bar_ && !log_now) return;
    emit(epoch, "train", i, total, make_stats(), log_now);
  }
  /// Logs a summary line (`train_epoch`, `valid`) at once; `subset` names the validated split.
  void log(int64_t epoch, const std::string& tag, const std::vector<Stat>& stats, const std::string& subset = "");
  /// Ends the bar's line so that other output starts on a fresh line.
  void finish_bar();

 private:
  void emit(int64_t epoch, const std::string& tag, int64_t i, int64_t total, const std::vector<Stat>& stats,
            bool log_line);
  LogFormat format_;
  bool bar_;
  int64_t log_interval_;
  std::FILE* out_;
  bool bar_open_ = false;
};

}  // namespace hetseq
