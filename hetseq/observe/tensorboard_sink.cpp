#include "hetseq/observe/tensorboard_sink.h"

#include <chrono>
#include <stdexcept>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/observe/tensorboard/event_file_writer.h"

namespace hetseq {

TensorBoardSink::TensorBoardSink(const std::string& logdir) {
  try {
    writer_ = std::make_unique<tensorboard::EventFileWriter>(logdir);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
}

TensorBoardSink::~TensorBoardSink() = default;

std::string TensorBoardSink::path() const { return writer_->path(); }

void TensorBoardSink::write(const LogRecord& record) {
  const std::vector<Stat>& stats = *record.stats;
  int64_t step = 0;
  for (const auto& s : stats) {
    if (s.name == "num_updates") step = static_cast<int64_t>(s.value);
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string prefix = record.subset.empty() ? record.tag : record.tag + "/" + record.subset;
  for (const auto& s : stats) {
    if (s.name == "num_updates") continue;
    const std::string tag = prefix + "/" + s.name;
    if (!s.list.empty()) {
      for (size_t r = 0; r < s.list.size(); ++r) {
        writer_->add_scalar(fmt::format("{}/rank{}", tag, r), static_cast<double>(s.list[r]), step, now);
      }
    } else if (!s.reals.empty()) {
      for (size_t r = 0; r < s.reals.size(); ++r) writer_->add_scalar(fmt::format("{}/rank{}", tag, r), s.reals[r], step, now);
    } else {
      writer_->add_scalar(tag, s.value, step, now);
    }
  }
  writer_->flush();
}

}  // namespace hetseq
