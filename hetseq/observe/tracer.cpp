#include "hetseq/observe/tracer.h"

#include <algorithm>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>

#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/parse.h"

namespace hetseq {

// Note [Tracing]
// ~~~~~~~~~~~~~~
// What a rank's trace holds, for every update in --trace-updates (1-based update numbers):
//   train row:   update ⊃ { broadcast_buffers, forward k, backward k ⊃ comm_wait, stat_sync, clip_grad,
//                optimizer }, and data (waiting for the update's batches) before it; validate and
//                checkpoint spans after an update.
//   bucket rows: allreduce of bucket i, from the moment the Reducer starts it (the bucket's last
//                gradient is in) until its future completes. Several run at once, so each bucket has
//                its own row; an allreduce that starts before its backward ends is the overlap.
// comm_wait is the part of the last backward spent after the last bucket had started, waiting for the
// network: the straggler signal (a fast rank waits for a slow one here).
//
// Host and device. Every span above is host-side (steady clock, "clock":"host" in its arguments). On
// CUDA the host returns from a kernel launch, and a NCCL allreduce's future completes when the
// collective is enqueued, so host spans show launch times, not work. There each TraceSpan also records
// a pair of CUDA events on the current stream, and the update's device spans go on the device row
// ("clock":"device"), placed after the update's first event, whose host time is taken when it is
// recorded (the device may run it later, so the row can sit early by the stream's backlog; the
// durations are exact).
//
// One clock. Each rank's steady clock has its own origin. At the start handshake every rank runs the
// same few allreduces and takes the return of the last one as time 0 (align_clocks); ranks leave a
// collective within one round trip of each other (the spread, in the file's metadata), so the rows of
// a merged trace line up to that. Each rank's system-clock offset from rank 0 is recorded as well.
//
// Cost. Outside the window a TraceSpan is one relaxed atomic load; inside, two clock reads and one
// vector append under a mutex (about 160 ns, benchmarks/trace_span_cost.cpp). On CUDA, inside the
// window, each span also creates and records two events, and each update starts by waiting for the
// previous update's events (one host-device synchronisation per traced update). The file is written
// when the window ends, so a week-long run writes only the updates asked for.

namespace {

using Clock = Tracer::Clock;

std::string trace_file(const std::string& dir, int64_t rank, const char* stem) {
  return (std::filesystem::path(dir) / fmt::format("{}_rank{}.json", stem, rank)).string();
}

}  // namespace

struct Tracer::DeviceSpan {
  explicit DeviceSpan(c10::Device device) : start(device.type(), c10::EventFlag::BACKEND_DEFAULT),
                                   end(device.type(), c10::EventFlag::BACKEND_DEFAULT) {}
  c10::Event start, end;
  const char* name = "";
  int track = kDeviceTrack;
  int64_t index = -1;
  bool ended = false;
};

void parse_trace_window(const std::string& text, TraceOptions& into) {
  const auto colon = text.find(':');
  const std::string what = fmt::format("--trace-updates {}: expected A:B, the first and last update to trace "
                                       "(1 <= A <= B), e.g. 100:120", text);
  if (colon == std::string::npos) throw UsageError(what);
  int64_t a = 0, b = 0;
  try {
    a = parse_int("--trace-updates", text.substr(0, colon));
    b = parse_int("--trace-updates", text.substr(colon + 1));
  } catch (const UsageError&) {
    throw UsageError(what);
  }
  if (a < 1 || b < a) throw UsageError(what);
  into.first_update = a;
  into.last_update = b;
}

Tracer::Tracer(TraceOptions options) : options_(std::move(options)) {
  ensure_writable_dir(options_.dir, "--trace-dir");
  path_ = trace_file(options_.dir, options_.rank, "trace");
  device_timing_ = options_.device.is_cuda();
}

Tracer::~Tracer() {
  try {
    finish();
  } catch (const std::exception& e) {
    log::warn("[trace] rank {}: writing {} failed: {}", options_.rank, path_, e.what());
  }
}

std::string Tracer::ops_path() const { return options_.ops ? trace_file(options_.dir, options_.rank, "ops") : ""; }

int64_t Tracer::to_us(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - clock_.zero).count();
}

void Tracer::begin_update(int64_t update) {
  if (written_) return;
  if (device_timing_) resolve_device_spans();
  const bool in = options_.first_update <= update && update <= options_.last_update;
  if (update > options_.last_update) {
    try {
      finish();
    } catch (const std::exception& e) {  // a diagnostic file is not worth the run
      log::warn("[trace] rank {}: writing {} failed: {}; training goes on without it", options_.rank, path_,
                e.what());
    }
    return;
  }
  if (in && !recording()) start_ops();
  recording_.store(in, std::memory_order_relaxed);
  if (in && device_timing_) {
    anchor_ = std::make_unique<DeviceSpan>(options_.device);
    const c10::impl::VirtualGuardImpl guard(options_.device.type());
    anchor_->start.record(guard.getStream(options_.device));
    anchor_host_ = Clock::now();
  }
}

void Tracer::add_span(const char* name, int track, Clock::time_point begin, Clock::time_point end, int64_t index,
                      int64_t bytes) {
  if (!recording()) return;
  const Span span{name, track, to_us(begin), to_us(end), index, bytes, false};
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.push_back(span);
}

// The device spans of the update that just ended: each event's time after the update's first one,
// placed at that one's host time (Note [Tracing], "Host and device").
void Tracer::resolve_device_spans() {
  if (!anchor_ || device_spans_.empty()) {
    device_spans_.clear();
    return;
  }
  const int64_t base = to_us(anchor_host_);
  std::lock_guard<std::mutex> lock(mutex_);
  anchor_->start.synchronize();
  for (const auto& d : device_spans_) {
    if (!d->ended) continue;
    // elapsedTime needs both events done; the start may be on another stream than the end.
    d->start.synchronize();
    d->end.synchronize();
    const auto b = static_cast<int64_t>(1e3 * anchor_->start.elapsedTime(d->start));
    const auto e = static_cast<int64_t>(1e3 * anchor_->start.elapsedTime(d->end));
    spans_.push_back(Span{d->name, d->track, base + b, base + e, d->index, -1, true});
  }
  device_spans_.clear();
}

Tracer::DeviceSpan* Tracer::begin_device_span(const char* name, int track, int64_t index) {
  if (!device_timing_ || !recording()) return nullptr;
  auto span = std::make_unique<DeviceSpan>(options_.device);
  span->name = name;
  span->track = track;
  span->index = index;
  const c10::impl::VirtualGuardImpl guard(options_.device.type());
  span->start.record(guard.getStream(options_.device));
  std::lock_guard<std::mutex> lock(mutex_);
  if (!anchor_) return nullptr;
  device_spans_.push_back(std::move(span));
  return device_spans_.back().get();
}

void Tracer::end_device_span(DeviceSpan* span) {
  if (!span) return;
  const c10::impl::VirtualGuardImpl guard(options_.device.type());
  span->end.record(guard.getStream(options_.device));
  std::lock_guard<std::mutex> lock(mutex_);
  span->ended = true;
}

void Tracer::start_ops() {
  if (!options_.ops || ops_running_) return;
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (options_.device.is_cuda()) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  // Kineto must be prepared (its activity profiler set up) before it starts, as torch.profiler does.
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  ops_running_ = true;
}

void Tracer::stop_ops() {
  if (!ops_running_) return;
  ops_running_ = false;
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  if (result) result->save(ops_path());
}

void Tracer::finish() {
  if (written_) return;
  written_ = true;
  if (device_timing_) resolve_device_spans();
  recording_.store(false, std::memory_order_relaxed);
  stop_ops();
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  const int64_t pid = options_.rank;
  auto meta = [&](const char* what, int64_t tid, const std::string& name) {
    events.push_back({{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
  };
  meta("process_name", 0, options_.label.empty() ? fmt::format("rank {}", options_.rank) : options_.label);
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  meta("thread_name", kTrainTrack, "train (host)");
  if (device_timing_) meta("thread_name", kDeviceTrack, "device (CUDA events)");
  std::vector<int64_t> buckets;
  for (const auto& s : spans_) {
    if (s.track >= kBucketTrack && s.track < kBucketTrack + kDeviceBucketOffset) buckets.push_back(s.track);
  }
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  for (int64_t t : buckets) meta("thread_name", t, fmt::format("allreduce bucket {} (host)", t - kBucketTrack));
  if (device_timing_) {
    // On CUDA each bucket also has a device row: from the launch point in the compute stream to the
    // allreduce's completion on the device.
    for (int64_t t : buckets) {
      meta("thread_name", t + kDeviceBucketOffset, fmt::format("allreduce bucket {} (device)", t - kBucketTrack));
    }
  }
  std::vector<Span> spans = spans_;
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin_us != b.begin_us ? a.begin_us < b.begin_us : a.end_us > b.end_us;  // parents first
  });
  for (const auto& s : spans) {
    nlohmann::ordered_json args = {{"clock", s.device ? "device" : "host"}};
    if (s.index >= 0) args[s.track >= kBucketTrack ? "bucket" : "index"] = s.index;
    if (s.bytes >= 0) args["bytes"] = s.bytes;
    events.push_back({{"name", s.name}, {"cat", s.device ? "device" : "host"}, {"ph", "X"}, {"ts", s.begin_us},
                      {"dur", std::max<int64_t>(0, s.end_us - s.begin_us)}, {"pid", pid}, {"tid", s.track},
                      {"args", args}});
  }
  nlohmann::ordered_json doc;
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ms";
  doc["otherData"] = {{"producer", "hetseq"},
                      {"rank", options_.rank},
                      {"trace_updates", fmt::format("{}:{}", options_.first_update, options_.last_update)},
                      {"time_zero_system_us", clock_.system_us},
                      {"clock_offsets_us", clock_.offsets_us},
                      {"clock_spread_us", clock_.spread_us}};
  const std::string text = doc.dump();
  write_file_atomically(path_, std::vector<char>(text.begin(), text.end()), "--trace-dir");
  log::info("[trace] rank {}: {} spans of updates {}:{} in {}{}", options_.rank, spans.size(), options_.first_update,
            options_.last_update, path_, options_.ops ? fmt::format(", op-level trace in {}", ops_path()) : "");
}

TraceSpan::TraceSpan(Tracer* tracer, const char* name, int64_t index)
    : tracer_(tracer && tracer->recording() ? tracer : nullptr), name_(name), index_(index) {
  if (!tracer_) return;
  begin_ = Tracer::Clock::now();
  device_ = tracer_->begin_device_span(name, kDeviceTrack, index);
}

TraceSpan::~TraceSpan() {
  if (!tracer_) return;
  try {
    tracer_->end_device_span(device_);
    tracer_->add_span(name_, kTrainTrack, begin_, Tracer::Clock::now(), index_);
  } catch (const std::exception&) {
    // A destructor must not throw (it may run while an error unwinds the update, a CUDA error
    // included); the span is lost, the error that matters goes on.
  }
}

}  // namespace hetseq
