#include "hetseq/train/step_profile.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

#ifdef HETSEQ_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace hetseq {
namespace {

double median_ms(std::vector<double> seconds) {
  if (seconds.empty()) return 0;
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  const double mid = n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
  return 1e3 * mid;
}

/// The peak allocation and the peak reservation: CUDA's caching allocator's on a GPU; on a CPU the process's
/// peak resident set, and no reservation.
std::pair<int64_t, int64_t> peak_memory_bytes(const c10::Device& device) {
#ifdef HETSEQ_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return {stats.allocated_bytes[all].peak, stats.reserved_bytes[all].peak};
  }
#endif
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return {static_cast<int64_t>(usage.ru_maxrss) * 1024, 0};  // kilobytes on Linux
}

}  // namespace

StepProfile::StepProfile(StepProfileOptions options) : options_(options) {
  if (options_.warmup < 1 || options_.timed < 1) {
    throw UsageError(fmt::format("--step-profile: {},{} needs WARMUP >= 1 and TIMED >= 1 updates (the span starts "
                                 "at the end of the last warm-up update)",
                                 options_.warmup, options_.timed));
  }
}

void StepProfile::on_update(const UpdateRecord& record) {
  ++seen_;
  if (seen_ < options_.warmup || result_) return;
  if (seen_ == options_.warmup) {  // the span starts at the end of the last warm-up update
    timer_ = make_compute_timer(options_.device);
    timer_->start();
    counter_ = std::make_unique<OpCounter>();
    return;
  }
  for (int64_t share : record.shares) samples_ += share;
  if (record.result && record.result->replayed) ++replayed_;
  data_s_.push_back(record.times.data_s);
  host_s_.push_back(record.times.total_s);
  device_s_.push_back(record.times.compute_s);
  if (seen_ == options_.warmup + options_.timed) finish();
}

void StepProfile::finish() {
  timer_->stop();
  StepProfileResult r;
  r.warmup_updates = options_.warmup;
  r.timed_updates = options_.timed;
  r.aten_ops_per_update = static_cast<double>(counter_->ops()) / static_cast<double>(options_.timed);
  r.aten_top_ops_per_update = static_cast<double>(counter_->top_level_ops()) / static_cast<double>(options_.timed);
  r.host_reads_per_update = static_cast<double>(counter_->host_reads()) / static_cast<double>(options_.timed);
  counter_.reset();
  r.seconds = timer_->seconds();  // waits for the device, once, after the timed updates
  r.clock = timer_->clock();
  r.samples = samples_;
  r.samples_per_s = r.seconds > 0 ? static_cast<double>(samples_) / r.seconds : 0;
  r.data_wait_ms = median_ms(data_s_);
  r.host_ms = median_ms(host_s_);
  r.device_ms = median_ms(device_s_);
  std::tie(r.peak_memory_bytes, r.peak_reserved_bytes) = peak_memory_bytes(options_.device);
  r.replayed_updates = replayed_;
  result_ = r;
  if (options_.rank == 0) {
    const std::string line = step_profile_json(r, options_.rank);
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
}

void StepProfile::on_train_end(int64_t /*last_epoch*/, int64_t num_updates) {
  if (result_ || options_.rank != 0) return;
  log::warn("[profile] --step-profile {},{}: the run ended after {} updates, before the last timed one; no profile "
            "(raise --max-update or --max-epoch)",
            options_.warmup, options_.timed, seen_);
}

std::string step_profile_json(const StepProfileResult& r, int64_t rank) {
  nlohmann::ordered_json j;
  j["tag"] = "step_profile";
  j["rank"] = rank;
  j["warmup_updates"] = r.warmup_updates;
  j["timed_updates"] = r.timed_updates;
  j["samples"] = r.samples;
  j["seconds"] = r.seconds;
  j["samples_per_s"] = r.samples_per_s;
  j["data_wait_ms"] = r.data_wait_ms;
  j["host_ms"] = r.host_ms;
  j["device_ms"] = r.device_ms;
  j["aten_ops_per_update"] = r.aten_ops_per_update;
  j["aten_top_ops_per_update"] = r.aten_top_ops_per_update;
  j["host_reads_per_update"] = r.host_reads_per_update;
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["peak_reserved_bytes"] = r.peak_reserved_bytes;
  j["replayed_updates"] = r.replayed_updates;
  j["clock"] = r.clock;
  return j.dump();
}

}  // namespace hetseq
