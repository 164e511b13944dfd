#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace hetseq {

/// One instant that every rank takes as time 0 of its trace, and what each rank's system clock read
/// then. See Note [Tracing], "One clock".
struct ClockAlignment {
  std::chrono::steady_clock::time_point zero = std::chrono::steady_clock::now();
  int64_t system_us = 0;                  // this rank's system clock at `zero`, microseconds since 1970
  std::vector<int64_t> offsets_us;        // [rank] its system clock minus rank 0's, at `zero`
  int64_t spread_us = 0;                  // how far apart the ranks can have taken `zero` (the last round trip)
};


/// The rows of a rank's timeline: the training thread, the device (CUDA events), and one row per
/// gradient bucket's allreduce (kBucketTrack + bucket index), because several run at once.
/// On CUDA a bucket's device-side span goes on row kBucketTrack + kDeviceBucketOffset + bucket index.
enum TraceTrack : int { kTrainTrack = 1, kDeviceTrack = 2, kBucketTrack = 100, kDeviceBucketOffset = 1000 };

/// What --trace-dir, --trace-updates and --trace-ops ask for.
struct TraceOptions {
  std::string dir;             // --trace-dir: where trace_rank<R>.json goes
  int64_t first_update = 1;    // --trace-updates A:B, 1-based update numbers, both included
  int64_t last_update = 100;
  bool ops = false;            // --trace-ops: LibTorch's profiler (Kineto) over the same updates
  int64_t rank = 0;
  std::string label;           // the rank's row name: "rank 0 (host, cpu, batch 32)"
  c10::Device device = c10::kCPU;  // CUDA: device-side spans from CUDA events as well
};

/// Parses --trace-updates `A:B` (1 <= A <= B); throws hetseq::UsageError naming the flag.
void parse_trace_window(const std::string& text, TraceOptions& into);

/// Records the timeline of a window of updates on one rank, in the Chrome trace-event format (opens
/// in Perfetto and chrome://tracing): one complete event ("ph":"X") per span, the rank as the process,
/// the TraceTrack as the thread. Spans come from the training thread (TraceSpan) and from the
/// backend's threads (bucket allreduces), so adding one is thread-safe. Outside the window nothing
/// is recorded and a TraceSpan costs one relaxed atomic load. See Note [Tracing].
class Tracer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Tracer(TraceOptions options);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  /// Puts this rank on the common timeline (see align_clocks); without it the rank's own start is 0.
  void set_clock(const ClockAlignment& clock) { clock_ = clock; }
  /// The rank's row name, once the start handshake has told its share.
  void set_label(std::string label) { options_.label = std::move(label); }
  /// The training loop, before update `update` (1-based, num_updates + 1): recording is on while
  /// `update` lies in the window; past it the file is written (a failure to write it is logged, and
  /// training goes on).
  void begin_update(int64_t update);
  /// True while spans are kept.
  bool recording() const { return recording_.load(std::memory_order_relaxed); }
  /// Adds a host-side span. `index` (micro-batch, bucket) and `bytes` are shown as its arguments
  /// when not negative.
  void add_span(const char* name, int track, Clock::time_point begin, Clock::time_point end, int64_t index = -1,
                int64_t bytes = -1);
  /// Writes trace_rank<R>.json (atomically) once; later calls do nothing. Also called by
  /// begin_update past the window, at the end of training, and by the destructor.
  void finish();
  /// The file this rank writes.
  const std::string& path() const { return path_; }
  /// The op-level trace (--trace-ops), or "" without it.
  std::string ops_path() const;

  /// CUDA only: device-side spans measured with CUDA events (see TraceSpan).
  bool device_timing() const { return device_timing_; }

  struct DeviceSpan;  // a pair of CUDA events, resolved when the update ends
  /// With device timing, while recording: records the start event of a device span on `track` on the
  /// current stream and returns it (null otherwise). end_device_span records its end on the stream
  /// current then (for a bucket: in its future's callback, where the stream waits for the collective).
  /// Thread-safe.
  DeviceSpan* begin_device_span(const char* name, int track, int64_t index);
  void end_device_span(DeviceSpan* span);

 private:
  friend class TraceSpan;
  struct Span {
    const char* name;
    int track;
    int64_t begin_us, end_us;  // on the common timeline
    int64_t index, bytes;
    bool device;               // timed with CUDA events
  };
  int64_t to_us(Clock::time_point t) const;
  void resolve_device_spans();
  void start_ops();
  void stop_ops();

  TraceOptions options_;
  std::string path_;
  ClockAlignment clock_;
  std::atomic<bool> recording_{false};
  bool written_ = false;
  bool ops_running_ = false;
  bool device_timing_ = false;
  std::mutex mutex_;
  std::vector<Span> spans_;
  std::vector<std::unique_ptr<DeviceSpan>> device_spans_;  // this update's, not yet resolved
  std::unique_ptr<DeviceSpan> anchor_;                      // the update's first device event
  Clock::time_point anchor_host_;
};

/// A span of the training thread from construction to destruction, on `tracer`'s timeline (nothing
/// when `tracer` is null or not recording). On CUDA it also times the same span on the device.
class TraceSpan {
 public:
  TraceSpan(Tracer* tracer, const char* name, int64_t index = -1);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer* tracer_;
  const char* name_;
  int64_t index_;
  Tracer::Clock::time_point begin_;
  Tracer::DeviceSpan* device_ = nullptr;
};

}  // namespace hetseq
