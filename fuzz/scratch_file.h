#pragma once
/// A file that holds the current fuzz input, for readers that take a path (the IDX and the BERT shard readers).

#include <cstddef>
#include <cstdint>
#include <string>

namespace hetseq::fuzz {

/// `/dev/shm/hetseq-fuzz-<pid>-<name>` (in memory; the system temp directory where there is no /dev/shm),
/// removed by the destructor. One per harness, reused for every input.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  /// Replaces the file's contents with `size` bytes from `data` and returns its path. Throws std::runtime_error
  /// when the file cannot be written (a broken test machine, not a finding of the harness).
  const std::string& write(const uint8_t* data, size_t size);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace hetseq::fuzz
