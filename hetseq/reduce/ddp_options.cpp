#include "hetseq/reduce/ddp_options.h"

#include <cmath>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

SharedMemoryReduceMode parse_shared_memory_reduce(const std::string& value) {
  if (value == "auto") return SharedMemoryReduceMode::kAuto;
  if (value == "on") return SharedMemoryReduceMode::kOn;
  if (value == "off") return SharedMemoryReduceMode::kOff;
  throw UsageError(fmt::format("--shared-memory-reduce: '{}' is not one of auto, on, off", value));
}

void check_ddp_options(const DdpOptions& o) {
  if (!std::isfinite(o.bucket_cap_mb) || o.bucket_cap_mb <= 0) {
    throw UsageError(fmt::format("--bucket-cap-mb: {} is not a positive number of MiB", o.bucket_cap_mb));
  }
  if (o.shared_memory == SharedMemoryReduceMode::kOn && o.comm_hook != CommHook::kNone) {
    throw UsageError(fmt::format("--shared-memory-reduce sums float32 buckets as they are; it cannot be combined with "
                                 "--ddp-comm-hook {}: leave one out",
                                 to_string(o.comm_hook)));
  }
}

}  // namespace hetseq
