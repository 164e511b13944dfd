#include "hetseq/session/session_options.h"

#include <algorithm>

namespace hetseq {

int64_t MixedPrecisionOptions::default_scale_window(int64_t micro_batches_per_update) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, micro_batches_per_update));
}

}  // namespace hetseq
