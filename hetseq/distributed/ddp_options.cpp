#include "hetseq/distributed/ddp_options.h"

#include <cmath>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

void check_ddp_options(const DdpOptions& o) {
  if (!std::isfinite(o.bucket_cap_mb) || o.bucket_cap_mb <= 0) {
    throw UsageError(fmt::format("--bucket-cap-mb: {} is not a positive number of MiB", o.bucket_cap_mb));
  }
}

}  // namespace hetseq
