#pragma once

#include <cstdint>
#include <vector>

#include "hetseq/data/batch.h"

namespace hetseq {

/// A split of a task's data, addressed by sample index. Tasks implement it; the library batches it.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples in the split.
  virtual int64_t size() const = 0;
  /// Builds the batch of the given samples, in the given order. Called from the loader's background
  /// threads (`--num-workers`), so it must be safe to call concurrently. An empty `indices` gives an
  /// empty batch.
  virtual Batch collate(const std::vector<int64_t>& indices) const = 0;
};

}  // namespace hetseq
