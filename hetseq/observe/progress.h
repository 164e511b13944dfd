#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hetseq/observe/log_format.h"

namespace hetseq {

/// One logged value: a number, an integer counter printed without decimals, (when `list` is not
/// empty) a list of integers such as the per-rank split, or (when `reals` is not empty) a list of
/// numbers such as a per-rank time. A `json_only` value goes into JSON records and sinks, not into
/// the text lines.
struct Stat {
  std::string name;
  double value;
  bool integer = false;
  std::vector<int64_t> list = {};
  std::vector<double> reals = {};
  bool json_only = false;
};

/// One record of the log, as every output receives it: `tag` is `train` (every --log-interval
/// updates), `train_epoch`, `valid` (with the validated `subset`), `ranks` (the per-rank summary of
/// the last --log-interval updates) or `ranks_epoch` (the same over the epoch).
struct LogRecord {
  int64_t epoch = 0;
  std::string tag;
  std::string subset;                 // the validated split, for `valid`
  const std::vector<Stat>* stats = nullptr;
  int64_t update_in_epoch = 0;        // for `train`: position in the epoch (0 otherwise)
  int64_t updates_in_epoch = 0;
};

/// An output of the log besides the console: a JSON-lines file (--json-log), TensorBoard
/// (--tensorboard-logdir). It receives every record, whatever --log-format says. A write that
/// throws drops the sink (with a warning); training goes on.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void write(const LogRecord& record) = 0;
};

/// `record` as one JSON object: its stats' names as keys, plus `epoch`, `tag` and (when set)
/// `subset`, `update_in_epoch` and `updates_in_epoch`.
std::string json_record(const LogRecord& record);

/// Prints training statistics: `--log-format simple` as aligned text for people, `json` as one JSON
/// object per line on stdout (the stats' names as keys, plus `epoch` and `tag`: `train`, `valid`,
/// `train_epoch`, and the per-rank summaries `ranks` and `ranks_epoch`), `none` not at all. On a
/// terminal, and unless --no-progress-bar, an in-place progress bar shows the position in the epoch
/// between log lines.
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
  /// A record for the JSON outputs only (stdout with --log-format json, and the sinks): figures that
  /// the text format shows in its own lines, such as the per-rank summary.
  void record(int64_t epoch, const std::string& tag, const std::vector<Stat>& stats);
  /// Ends the bar's line so that other output starts on a fresh line.
  void finish_bar();
  /// Another output for every record (kept for the logger's lifetime).
  void add_sink(std::shared_ptr<LogSink> sink) { sinks_.push_back(std::move(sink)); }

 private:
  void emit(int64_t epoch, const std::string& tag, int64_t i, int64_t total, const std::vector<Stat>& stats,
            bool log_line);
  void write_sinks(const LogRecord& record);
  LogFormat format_;
  bool bar_;
  int64_t log_interval_;
  std::FILE* out_;
  bool bar_open_ = false;
  std::vector<std::shared_ptr<LogSink>> sinks_;
};

}  // namespace hetseq
