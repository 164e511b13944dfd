#include "hetseq/task/metric.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {
namespace {

// The metric a built-in one counts as when no step logged it (see MetricSums::get); null: none.
const Metric* default_of(const Metric& metric) {
  if (metric == metrics::kNsentences || metric == metrics::kNtokens) return &metrics::kSampleSize;
  if (metric == metrics::kNllLoss) return &metrics::kLoss;
  return nullptr;
}

}  // namespace

double MetricSums::get_or(const Metric& metric, double fallback) const {
  if (auto it = sums_.find(metric.key()); it != sums_.end()) return it->second;
  if (const Metric* other = default_of(metric)) return get_or(*other, fallback);
  return fallback;
}

double MetricSums::get(const Metric& metric) const {
  if (auto it = sums_.find(metric.key()); it != sums_.end()) return it->second;
  if (const Metric* other = default_of(metric)) return get(*other);
  if (sum_or(sums_, metrics::kSampleSize.key()) == 0) return 0;  // no step ran: every sum is 0
  std::vector<std::string> logged;
  for (const auto& [name, value] : sums_) logged.push_back(name);
  throw InternalError(fmt::format("the metric '{}' was read but no step logged it (logged: {}); add it in the "
                                  "task's loss with StepOutput::add",
                                  metric.name(), fmt::join(logged, ", ")));
}

std::map<std::string, double> evaluate(const std::vector<Ratio>& ratios, const MetricSums& sums) {
  std::map<std::string, double> values;
  for (const Ratio& r : ratios) {
    const double denominator = sums.get(r.denominator);
    if (denominator > 0) values[r.name] = r.factor * sums.get(r.numerator) / denominator;
  }
  return values;
}

}  // namespace hetseq
