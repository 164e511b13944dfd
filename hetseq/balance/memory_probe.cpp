#include "hetseq/balance/memory_probe.h"

#include <algorithm>
#include <cmath>

#include <c10/util/Exception.h>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"

namespace hetseq {

int64_t probe_micro_batch_cap(const std::function<void(int64_t)>& try_size, const std::function<void()>& release,
                              const ProbeOptions& o) {
  HETSEQ_ASSERT(o.start >= 1 && o.limit >= o.start && o.margin > 0 && o.margin <= 1, "probe options {} {} {}",
                o.start, o.limit, o.margin);
  int64_t fits = 0;
  for (int64_t b = o.start;; b = std::min(o.limit, 2 * b)) {
    try {
      try_size(b);
      release();
    } catch (const c10::OutOfMemoryError&) {
      release();
      log::info("[balance] a micro-batch of {} samples runs out of device memory", b);
      break;
    }
    fits = b;
    if (b == o.limit) return 0;  // a whole update fits at once: no cap needed
  }
  if (fits == 0) {
    throw InputError(fmt::format("--max-sentences {}: one micro-batch of that size runs out of device memory on this "
                                 "rank; lower it (or use --update-freq)",
                                 o.start));
  }
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(o.margin * static_cast<double>(fits))));
}

}  // namespace hetseq
