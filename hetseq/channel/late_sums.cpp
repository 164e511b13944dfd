#include "hetseq/channel/late_sums.h"

namespace hetseq {

void LateSums::add_totals(LogSums& into, const double* host) const {
  const auto width = static_cast<int64_t>(names.size());
  const int64_t count = row_count();
  for (int64_t i = 0; i < width; ++i) {
    double total = 0;  // in row order, as every rank adds them: see LateSums
    for (int64_t r = 0; r < count; ++r) total += host[r * width + i];
    into[names[static_cast<size_t>(i)]] += total;
  }
}

}  // namespace hetseq
