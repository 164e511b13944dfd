#include "hetseq/reduce/ddp_options.h"

#include <cmath>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

SharedMemoryReduceMode parse_shared_memory_reduce(const std::string& value, Naming naming) {
  if (value == "auto") return SharedMemoryReduceMode::kAuto;
  if (value == "on") return SharedMemoryReduceMode::kOn;
  if (value == "off") return SharedMemoryReduceMode::kOff;
  const auto& o = kSharedMemoryOption;
  const std::string given = naming == Naming::kPython ? o.value(naming, value) : fmt::format("'{}'", value);
  throw UsageError(fmt::format("{}: {} is not one of {}, {}, {}", o.name(naming), given, o.value(naming, "auto"),
                               o.value(naming, "on"), o.value(naming, "off")));
}

std::string to_string(SharedMemoryReduceMode mode) {
  switch (mode) {
    case SharedMemoryReduceMode::kAuto: return "auto";
    case SharedMemoryReduceMode::kOn: return "on";
    case SharedMemoryReduceMode::kOff: return "off";
  }
  HETSEQ_ASSERT(false, "unknown SharedMemoryReduceMode");
  return "";
}

void PowerSgdOptions::validate() const {
  if (rank < 1) {
    throw UsageError(fmt::format("--powersgd-rank: {} must be a positive integer", rank));
  }
  if (start_update < 0) {
    throw UsageError(fmt::format("--powersgd-start-update: {} is negative; it must be 0 or more", start_update));
  }
}

void DdpOptions::validate() const {
  if (!std::isfinite(bucket_cap_mb) || bucket_cap_mb <= 0) {
    throw UsageError(
        fmt::format("{}: {} is not a positive number of MiB", kBucketCapMbOption.name(naming), bucket_cap_mb));
  }
  if (shared_memory == SharedMemoryReduceMode::kOn && comm_hook != CommHook::kNone) {
    throw UsageError(fmt::format("--shared-memory-reduce sums float32 buckets as they are; it cannot be combined with "
                                 "--ddp-comm-hook {}: leave one out",
                                 to_string(comm_hook)));
  }
  powersgd.validate();
}

}  // namespace hetseq
