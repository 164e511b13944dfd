#pragma once

#include <cstdio>
#include <string>

#include "hetseq/observe/progress.h"

namespace hetseq {

/// --json-log FILE: every log record (train, train_epoch, valid, ranks) as one JSON object per line,
/// whatever --log-format prints, flushed per line so that scripts/plot_run.py and other readers can
/// follow a run while it goes on. A resumed run appends to the same file.
class JsonLogSink final : public LogSink {
 public:
  /// Opens `path` for appending (creating its directory); throws hetseq::UsageError naming --json-log
  /// when it cannot.
  explicit JsonLogSink(const std::string& path);
  ~JsonLogSink() override;
  JsonLogSink(const JsonLogSink&) = delete;
  JsonLogSink& operator=(const JsonLogSink&) = delete;
  void write(const LogRecord& record) override;

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace hetseq
