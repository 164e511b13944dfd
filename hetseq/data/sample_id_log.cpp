#include "hetseq/data/sample_id_log.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

SampleIdLog::SampleIdLog(const std::string& dir, int64_t rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  path_ = (std::filesystem::path(dir) / fmt::format("samples-rank{}.txt", rank)).string();
  file_ = std::fopen(path_.c_str(), "a");
  if (file_ == nullptr) {
    throw InputError(fmt::format("--dump-sample-ids {}: cannot open {} for appending: {}", dir, path_,
                                 std::strerror(errno)));
  }
}

SampleIdLog::~SampleIdLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void SampleIdLog::write(int64_t epoch, int64_t update, const std::vector<std::vector<int64_t>>& micro_batches) {
  std::string line = fmt::format("{} {}", epoch, update);
  for (const auto& ids : micro_batches) {
    for (int64_t id : ids) fmt::format_to(std::back_inserter(line), " {}", id);
  }
  line += '\n';
  if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) {
    throw InputError(fmt::format("--dump-sample-ids: writing {} failed: {}", path_, std::strerror(errno)));
  }
}

}  // namespace hetseq
