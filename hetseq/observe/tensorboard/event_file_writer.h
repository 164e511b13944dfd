#pragma once
/// TensorBoard event files: scalars that `tensorboard --logdir DIR` plots, while a run goes on and after.
/// Protobuf stays behind this header (see hetseq/CMakeLists.txt): it is built in its own target, without
/// LibTorch's include paths, which bundle protobuf headers of another version.

#include <cstdint>
#include <memory>
#include <string>

namespace hetseq::tensorboard {

/// Writes one event file, `<logdir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>` (n counts the
/// writers this process opened), as TFRecord records of TensorBoard's Event messages. The first record
/// names the format ("brain.Event:2"); each add_scalar() appends one record, and flush() hands them to the OS.
/// Meant for the observer that logs training and validation values at log intervals; not thread-safe.
class EventFileWriter {
 public:
  /// Creates `logdir` (and its parents) if missing and opens a new event file in it. Throws
  /// std::runtime_error naming the path when the directory cannot be created or the file not written.
  explicit EventFileWriter(const std::string& logdir);
  /// Flushes and closes the file.
  ~EventFileWriter();

  /// Appends the scalar `value` (stored as float32, as TensorBoard does) under `tag` (e.g. "train/loss")
  /// at `step`, stamped `wall_time_s` seconds since the Unix epoch (buffered until flush()). Throws
  /// std::runtime_error naming the file when it cannot be written.
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time_s);

  /// Hands everything written so far to the OS, so that TensorBoard reads it. Throws like add_scalar().
  void flush();

  /// The event file's path.
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hetseq::tensorboard
