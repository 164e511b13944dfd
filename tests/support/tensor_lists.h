#pragma once
// Comparing lists of tensors, bit for bit.

#include <vector>

#include <torch/torch.h>

namespace hetseq::test {

/// Whether `a` and `b` have as many tensors, each defined and equal to the other's in shape, dtype and every bit.
inline bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].defined() || !b[i].defined() || !torch::equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace hetseq::test
