#pragma once

#include <memory>
#include <string>

#include "hetseq/observe/progress.h"

namespace hetseq {

namespace tensorboard {
class EventFileWriter;
}  // namespace tensorboard

/// --tensorboard-logdir DIR (fairseq's flag): every log record as TensorBoard scalars, step = the
/// record's num_updates, readable while the run goes on (`tensorboard --logdir DIR`). Tags are
/// `<tag>/<name>` (`train/loss`, `train_epoch/accuracy`), `valid/<subset>/<name>` for validation,
/// and `<tag>/<name>/rank<R>` for per-rank lists (`train/split/rank1`, `ranks/wait_ms/rank0`).
/// The event format comes from protobuf through hetseq::tensorboard::EventFileWriter.
class TensorBoardSink final : public LogSink {
 public:
  /// Creates the directory and the event file; throws hetseq::UsageError naming the flag when it cannot.
  explicit TensorBoardSink(const std::string& logdir);
  ~TensorBoardSink() override;
  void write(const LogRecord& record) override;
  /// The event file being written.
  std::string path() const;

 private:
  std::unique_ptr<tensorboard::EventFileWriter> writer_;
};

}  // namespace hetseq
