// A task library for --user-dir, built by the build (target hetseq_test_widths_plugin) and loaded by the tests
// into the real hetseq-train: it declares --hidden-units, the flag MNIST also declares, with a default and help
// of its own (Note [A task's flags are its own] in hetseq/cli/train_options.cpp). Its model, 2 -> H -> H -> 2,
// has H^2 + 6H + 2 parameters: 1218 at its default of 32, 17154 at MNIST's 128. Its --points is a flag that
// no built-in task declares.
#include <hetseq/hetseq.h>

namespace {

// `points` points on a line, labelled by their side of 0; no files, no randomness.
class SidesData : public hetseq::Dataset {
 public:
  explicit SidesData(int64_t points) : x_(torch::linspace(-1, 1, points).unsqueeze(1).repeat({1, 2})) {
    y_ = (x_.select(1, 0) > 0).to(torch::kLong);
  }
  int64_t size() const override { return y_.size(0); }
  hetseq::Batch collate(const std::vector<int64_t>& indices) const override {
    const torch::Tensor i = torch::tensor(indices, torch::kLong);
    return {{{"x", x_.index_select(0, i)}, {"y", y_.index_select(0, i)}}, static_cast<int64_t>(indices.size())};
  }

 private:
  torch::Tensor x_, y_;  // [points, 2], [points]
};

class WidthsTask : public hetseq::ModelTask<torch::nn::SequentialImpl> {
 public:
  WidthsTask(int64_t hidden, int64_t points) : hidden_(hidden), points_(points) {}
  std::shared_ptr<torch::nn::SequentialImpl> make_model() override {
    return torch::nn::Sequential(torch::nn::Linear(2, hidden_), torch::nn::Tanh(), torch::nn::Linear(hidden_, hidden_),
                                 torch::nn::Tanh(), torch::nn::Linear(hidden_, 2)).ptr();
  }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string& split) override {
    return std::make_shared<SidesData>(split == "train" ? points_ : 10);
  }
  hetseq::StepOutput loss(torch::nn::SequentialImpl& model, const hetseq::Batch& batch) override {
    namespace F = torch::nn::functional;
    hetseq::StepOutput out;
    out.loss = F::cross_entropy(model.forward(batch.at("x")), batch.at("y"),
                                F::CrossEntropyFuncOptions().reduction(torch::kSum));
    out.sample_size = static_cast<double>(batch.num_samples);
    return out;
  }

 private:
  int64_t hidden_;
  int64_t points_;
};

hetseq::TaskSpec widths_spec() {
  hetseq::TaskSpec spec{"widths", "a 2-class MLP whose --hidden-units is not MNIST's (a test's task library)"};
  spec.flags = [](hetseq::FlagSet& flags) {
    flags.add("hidden-units", "width of both hidden layers of the widths MLP", "32", "N");
    flags.add("points", "points in the train split", "40", "N");  // a name no built-in task declares
  };
  spec.defaults = {{"optimizer", "sgd"}, {"lr", "0.1"}, {"data", "-"}};
  spec.create = [](const hetseq::FlagValues& args, const hetseq::TaskContext&) {
    return std::make_unique<WidthsTask>(args.integer("hidden-units"), args.integer("points"));
  };
  return spec;
}
HETSEQ_REGISTER_TASK(widths, widths_spec);

}  // namespace
