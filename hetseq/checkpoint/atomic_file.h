#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace hetseq {

/// Writes `bytes` to `path` so that a reader, or a process killed at any moment, sees either the old
/// file whole or the new one whole: the bytes go to a temporary file in the same directory (named
/// `.NAME.hetseq-tmp-PID`), which is flushed, synced, renamed over `path`, and the directory synced.
/// Throws hetseq::InputError naming the file (and `flag`, the option that chose its directory) on
/// failure, and removes the temporary file then.
void write_file_atomically(const std::filesystem::path& path, const std::vector<char>& bytes,
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
