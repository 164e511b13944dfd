#include "hetseq/observe/json_log_sink.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

JsonLogSink::JsonLogSink(const std::string& path) : path_(path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) {
    throw UsageError(fmt::format("--json-log {}: cannot open it for appending ({}); give a file in a writable "
                                 "directory",
                                 path, std::strerror(errno)));
  }
}

JsonLogSink::~JsonLogSink() {
  if (file_) std::fclose(file_);
}

void JsonLogSink::write(const LogRecord& record) {
  const std::string line = json_record(record) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw InputError(fmt::format("--json-log {}: writing failed ({}); is the disk full?", path_, std::strerror(errno)));
  }
}

}  // namespace hetseq
