#pragma once
// The data of the tests' smallest tasks: `n` points on [-1, 1], labelled by whether x > 0.

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "hetseq/data/dataset.h"

namespace hetseq::test {

class LineData : public Dataset {
 public:
  explicit LineData(int64_t n) : x_(torch::linspace(-1, 1, n).unsqueeze(1)), y_((x_.squeeze(1) > 0).to(torch::kLong)) {}
  int64_t size() const override { return x_.size(0); }
  Batch collate(const std::vector<int64_t>& indices) const override {
    const torch::Tensor i = torch::tensor(indices, torch::kLong);
    return {{{"x", x_.index_select(0, i)}, {"y", y_.index_select(0, i)}}, static_cast<int64_t>(indices.size())};
  }

 private:
  torch::Tensor x_, y_;  // [n, 1], [n]
};

}  // namespace hetseq::test
