#pragma once

#include <string>
#include <vector>

#include "hetseq/task/task.h"

namespace hetseq {

/// Statistics summed over the ranks on the device, left there for the host to read after the device has
/// finished them (Note [Reading an update late], Note [Stat sync]): `rows` is a float64 tensor of
/// [row][name] on the device, `names` [name] sorted; a statistic's total over the ranks is its column added
/// in row order. The rows are the ranks' own values in rank order (gathered, the default), so that every
/// rank adds the same numbers in the same order and gets bitwise the same totals, or one row of sums
/// (--fast-stat-sync's allreduce, one process).
struct LateSums {
  std::vector<std::string> names;  // [name]
  torch::Tensor rows;              // [row][name] float64, on the device; undefined when names is empty

  bool empty() const { return names.empty(); }
  /// The number of rows (0 when empty).
  int64_t row_count() const { return empty() ? 0 : rows.size(0); }
  /// Adds the totals into `into`, from `host`, the rows as read on the host (row-major, row_count() rows).
  void add_totals(LogSums& into, const double* host) const;
};

}  // namespace hetseq
