// A task written outside hetseq's tree: two interleaved spirals, told apart by a small MLP.
#include <hetseq/hetseq.h>

namespace {
const hetseq::Metric kCorrect{"ncorrect"};  // correct predictions, summed on the device
// `points` points of two spirals (label 0 and 1, alternating), made without files or randomness.
class Spirals : public hetseq::Dataset {
 public:
  Spirals(int64_t points, double shift) : y_(torch::arange(points) % 2) {
    const torch::Tensor t = ((torch::arange(points) / 2).to(torch::kFloat) + shift) / (points / 2) * 4 + 0.5;
    const torch::Tensor side = 1 - 2 * y_.to(torch::kFloat);  // class 1: class 0 turned by half a turn
    x_ = torch::stack({side * t * torch::cos(t), side * t * torch::sin(t)}, 1) / 10;
  }
  int64_t size() const override { return y_.size(0); }
  hetseq::Batch collate(const std::vector<int64_t>& indices) const override {  // called from loader threads
    const torch::Tensor i = torch::tensor(indices, torch::kLong);
    return {{{"x", x_.index_select(0, i)}, {"y", y_.index_select(0, i)}}, static_cast<int64_t>(indices.size())};
  }
  torch::Tensor x_, y_;  // [points, 2], [points]
};

class SpiralsTask : public hetseq::ModelTask<torch::nn::SequentialImpl> {
 public:
  SpiralsTask(int64_t hidden, int64_t points) : hidden_(hidden), points_(points) {}
  std::shared_ptr<torch::nn::SequentialImpl> make_model() override {
    return torch::nn::Sequential(torch::nn::Linear(2, hidden_), torch::nn::Tanh(), torch::nn::Linear(hidden_, hidden_),
                                 torch::nn::Tanh(), torch::nn::Linear(hidden_, 2)).ptr();
  }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string& split) override {
    return std::make_shared<Spirals>(points_, split == "train" ? 0.0 : 0.5);  // valid: the points between
  }
  hetseq::StepOutput loss(torch::nn::SequentialImpl& model, const hetseq::Batch& batch) override {
    namespace F = torch::nn::functional;
    const torch::Tensor logits = model.forward(batch.at("x"));
    hetseq::StepOutput out;  // the loss summed over the batch, and the count it sums over
    out.loss = F::cross_entropy(logits, batch.at("y"), F::CrossEntropyFuncOptions().reduction(torch::kSum));
    out.sample_size = static_cast<double>(batch.num_samples);
    out.add(kCorrect, logits.argmax(1).eq(batch.at("y")).sum());
    return out;
  }
  std::vector<hetseq::Ratio> ratios() const override {  // logged as `accuracy`: 100 * ncorrect / sample_size
    return {{"accuracy", kCorrect, hetseq::metrics::kSampleSize, 100}};
  }
  int64_t hidden_, points_;
};

hetseq::TaskSpec spirals_spec() {
  hetseq::TaskSpec spec{"spirals", "two interleaved spirals, a 2-class MLP (examples/custom_task)"};
  spec.flags = [](hetseq::FlagSet& flags) {
    flags.add("hidden", "hidden units", "32", "N").add("points", "points per split", "2000", "N");
  };
  spec.defaults = {{"optimizer", "adam"}, {"lr", "0.03"}, {"data", "-"}};
  spec.create = [](const hetseq::FlagValues& args, const hetseq::TaskContext&) {
    return std::make_unique<SpiralsTask>(args.integer("hidden"), args.integer("points"));
  };
  return spec;
}
HETSEQ_REGISTER_TASK(spirals, spirals_spec);

}  // namespace
