#pragma once
/// Typed metrics: a sum that a task logs is a named constant (hetseq::Metric), declared once and used to
/// add to a step's output (StepOutput::add) and to read the reduced sums back (MetricSums), so that a
/// misspelt metric is a compile error instead of a silent zero. The built-in ones are in
/// hetseq::metrics. See docs/API.md, "Metrics".

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace hetseq {

/// Sums that steps report for logging, keyed by metric name: what travels between the ranks and into
/// the logs. Sums, not means, so that they add up across micro-batches and ranks. A task reads them
/// through MetricSums.
using LogSums = std::map<std::string, double>;

/// The sum called `key` in `sums`, or `fallback` when there is none (for the library's own sums; a task
/// reads MetricSums).
inline double sum_or(const LogSums& sums, const std::string& key, double fallback = 0) {
  auto it = sums.find(key);
  return it == sums.end() ? fallback : it->second;
}

/// A named sum that a task logs, declared once as a constant beside the task:
///
///     const hetseq::Metric kCorrect{"ncorrect"};   // then out.add(kCorrect, ...) and sums[kCorrect]
///
/// The name is what the logs, the JSON records and --best-checkpoint-metric see. Only a string literal
/// names a metric (the name is not copied).
class Metric {
 public:
  template <std::size_t N>
  explicit constexpr Metric(const char (&name)[N]) : name_(name, N - 1) {
    static_assert(N > 1, "a metric needs a name");
  }
  constexpr std::string_view name() const { return name_; }
  std::string key() const { return std::string(name_); }
  constexpr bool operator==(const Metric& other) const { return name_ == other.name_; }
  constexpr bool operator!=(const Metric& other) const { return name_ != other.name_; }

 private:
  std::string_view name_;
};

/// The metrics the library itself reads (fairseq's names).
namespace metrics {
/// The loss summed over the step's samples, in nats (logged per sample_size, in bits). Logged for every
/// step from StepOutput::loss unless the task adds its own.
inline constexpr Metric kLoss{"loss"};
/// The negative log-likelihood summed over the tokens (logged per ntokens, in bits). Default: kLoss.
inline constexpr Metric kNllLoss{"nll_loss"};
/// The count the loss sums over: StepOutput::sample_size, which the library logs itself.
inline constexpr Metric kSampleSize{"sample_size"};
/// Sentences (samples) in the step. Default: kSampleSize.
inline constexpr Metric kNsentences{"nsentences"};
/// Tokens in the step (for nll_loss and words per batch). Default: kSampleSize.
inline constexpr Metric kNtokens{"ntokens"};
}  // namespace metrics

/// The reduced sums (over an update's micro-batches and ranks, an epoch, or a validation pass), read by
/// metric: a view of the LogSums it is built from, which must outlive it.
class MetricSums {
 public:
  MetricSums(const LogSums& sums) : sums_(sums) {}  // NOLINT: implicit, the library passes its LogSums

  /// The sum of `metric`. kNsentences and kNtokens default to kSampleSize and kNllLoss to kLoss, as the
  /// logs count them. When no step ran (no sample_size), every sum is 0. Throws hetseq::InternalError
  /// naming the metric and the ones that were logged when steps ran but none logged `metric` (a task
  /// that reads a metric it never adds).
  double get(const Metric& metric) const;
  double operator[](const Metric& metric) const { return get(metric); }
  /// The sum of `metric`, or `fallback` when no step logged it.
  double get_or(const Metric& metric, double fallback) const;
  /// Whether some step logged `metric` itself (no defaults).
  bool has(const Metric& metric) const { return sums_.count(metric.key()) > 0; }
  /// Every sum by name.
  const LogSums& all() const { return sums_; }

 private:
  const LogSums& sums_;
};

/// A metric derived from the reduced sums, `factor * numerator / denominator`, logged as `name` when the
/// denominator is positive: {"accuracy", kCorrect, metrics::kSampleSize, 100} is the percentage of
/// correct samples. See Task::ratios.
struct Ratio {
  std::string name;
  Metric numerator;
  Metric denominator;
  double factor = 1;
};

/// The ratios' values by name, from `sums` (those whose denominator is 0 are left out).
std::map<std::string, double> evaluate(const std::vector<Ratio>& ratios, const MetricSums& sums);

}  // namespace hetseq
