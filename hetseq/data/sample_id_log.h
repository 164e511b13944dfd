#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace hetseq {

/// `--dump-sample-ids DIR`: one rank's record of which samples each update used, appended to
/// `DIR/samples-rankR.txt` as lines `EPOCH UPDATE ID ID ...` (ids over all the update's
/// micro-batches). Lets a user (and the tests) check that every sample of an epoch was used exactly
/// once over all ranks, also across a resume on another cluster.
class SampleIdLog {
 public:
  /// Creates DIR if needed and opens the file for appending. Throws hetseq::InputError naming the
  /// flag and the file when that fails.
  SampleIdLog(const std::string& dir, int64_t rank);
  ~SampleIdLog();
  SampleIdLog(const SampleIdLog&) = delete;
  SampleIdLog& operator=(const SampleIdLog&) = delete;

  /// Appends one update's line and flushes it.
  void write(int64_t epoch, int64_t update, const std::vector<std::vector<int64_t>>& micro_batches);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace hetseq
