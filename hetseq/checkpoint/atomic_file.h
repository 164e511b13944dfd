#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace hetseq {

/// The temporary file that write_file_atomically hands to its `write` callback: bytes are appended.
/// A failed write is kept (the first one) and turns later writes into no-ops, so that a caller that
/// must not throw (a zip writer's callback) can go on writing; write_file_atomically then reports it.
class FileSink {
 public:
  explicit FileSink(int fd) : fd_(fd) {}
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  /// Appends `n` bytes from `data`. Returns false when this or an earlier write failed.
  bool write(const void* data, size_t n) noexcept;
  /// Appends what is left to read of the open file `fd` (copy_file_range where the kernel copies,
  /// else through a 1 MiB buffer). Returns false when reading or writing failed.
  bool append_file(int fd) noexcept;

  bool failed() const { return error_ != 0; }
  /// What failed ("writing failed: No space left on device"); empty when nothing did.
  std::string error() const;

 private:
  bool fail(const char* what, int error) noexcept;

  int fd_;
  int error_ = 0;              // errno of the first failure
  const char* what_ = nullptr;  // "writing" or "reading"
};

/// Writes a file so that a reader, or a process killed at any moment, sees either the old file at
/// `path` whole or the new one whole: `write` appends the content to a temporary file in the same
/// directory (named `.NAME.hetseq-tmp-PID`), which is synced, renamed over `path`, and the directory
/// synced. Throws hetseq::InputError naming the file (and `flag`, the option that chose its
/// directory) when the file cannot be created or written, and removes the temporary file then, also
/// when `write` throws (its exception propagates).
void write_file_atomically(const std::filesystem::path& path, const std::function<void(FileSink&)>& write,
                           const std::string& flag = "--save-dir");

/// write_file_atomically with `bytes` as the content.
void write_file_atomically(const std::filesystem::path& path, const std::vector<char>& bytes,
                           const std::string& flag = "--save-dir");

/// Copies the file `from` to `to` atomically (as write_file_atomically), without holding it in memory.
/// Throws hetseq::InputError naming the files.
void copy_file_atomically(const std::filesystem::path& from, const std::filesystem::path& to,
                          const std::string& flag = "--save-dir");

/// Removes temporary files that write_file_atomically left in `dir` when a process was killed while
/// writing (only files it names; the caller must be the only writer in `dir`). Returns how many.
int remove_stale_temporaries(const std::filesystem::path& dir);

/// Reads a whole file. Throws hetseq::InputError naming it when it is missing or unreadable.
std::vector<char> read_file(const std::filesystem::path& path);

/// Creates `dir` if needed and checks that files can be created in it. Throws hetseq::InputError
/// naming `flag` and the path otherwise. Called before any training work starts.
void ensure_writable_dir(const std::filesystem::path& dir, const std::string& flag);

}  // namespace hetseq
