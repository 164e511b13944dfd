#pragma once
// The data of the test plugins' point tasks (bn_units, branch_units): points in 6 dimensions labelled by the sign of
// their sum, and their summed cross-entropy.
#include <hetseq/hetseq.h>

namespace hetseq::test {

/// `points` points drawn from `seed`, labelled 1 where their coordinates sum above 0.
class PointsData : public hetseq::Dataset {
 public:
  PointsData(int64_t points, uint64_t seed) {
    torch::manual_seed(seed);
    x_ = torch::randn({points, 6});
    y_ = (x_.sum(1) > 0).to(torch::kLong);
  }
  int64_t size() const override { return y_.size(0); }
  hetseq::Batch collate(const std::vector<int64_t>& indices) const override {
    const torch::Tensor i = torch::tensor(indices, torch::kLong);
    return {{{"x", x_.index_select(0, i)}, {"y", y_.index_select(0, i)}}, static_cast<int64_t>(indices.size())};
  }

 private:
  torch::Tensor x_, y_;  // [points, 6], [points]
};

/// The summed cross-entropy of `logits` ([batch, 2]) against the batch's labels, over its samples.
inline hetseq::StepOutput points_loss(const torch::Tensor& logits, const hetseq::Batch& batch) {
  namespace F = torch::nn::functional;
  hetseq::StepOutput out;
  out.loss = F::cross_entropy(logits, batch.at("y"), F::CrossEntropyFuncOptions().reduction(torch::kSum));
  out.sample_size = static_cast<double>(batch.num_samples);
  return out;
}

}  // namespace hetseq::test
