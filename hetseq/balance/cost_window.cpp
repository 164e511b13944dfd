#include "hetseq/balance/cost_window.h"

#include <algorithm>
#include <cmath>

namespace hetseq {

void CostWindow::add(const CostSample& sample) {
  if (sample.samples <= 0 || sample.micro_batches <= 0) return;
  samples_.push_back(sample);
  while (samples_.size() > capacity_) samples_.pop_front();
}

RankCost CostWindow::fit() const {
  std::vector<std::pair<int64_t, double>> points;  // (micro-batch size, seconds per micro-batch)
  for (const CostSample& s : samples_) {
    const double m = static_cast<double>(s.micro_batches);
    points.emplace_back(static_cast<int64_t>(std::llround(static_cast<double>(s.samples) / m)), s.seconds / m);
  }
  return fit_rank_cost(points);
}

double CostWindow::seconds_per_sample() const {
  double seconds = 0, samples = 0;
  for (const CostSample& s : samples_) {
    seconds += s.seconds;
    samples += static_cast<double>(s.samples);
  }
  return samples > 0 ? seconds / samples : 0;
}

double CostWindow::relative_error() const {
  const size_t n = samples_.size();
  if (n < 2) return 0;
  double sum = 0, squares = 0;
  for (const CostSample& s : samples_) {
    const double x = s.seconds / static_cast<double>(s.samples);
    sum += x;
    squares += x * x;
  }
  const double mean = sum / static_cast<double>(n);
  const double variance = std::max(0.0, (squares - sum * mean) / static_cast<double>(n - 1));
  return mean > 0 ? std::sqrt(variance / static_cast<double>(n)) / mean : 0;
}

}  // namespace hetseq
