// A task library for --user-dir (target hetseq_test_bn_units_plugin) whose model --zero-sharding full holds unit
// by unit and whose units keep state outside their parameters: each unit is Linear -> BatchNorm1d -> ReLU ->
// Dropout, so a pass changes the BatchNorms' running statistics and counters and draws from the generator. A
// stand-in pass (Note [Stand-in passes]) must leave all of that as it found it, for full to train as none does.
// The head, outside the units, is the root.
#include <hetseq/hetseq.h>
#include <hetseq/task/model_units.h>

#include "points_data.h"

namespace {

struct BnUnitsNetImpl : torch::nn::Module, hetseq::ShardableModel {
  BnUnitsNetImpl() {
    for (int i = 0; i < 2; ++i) {
      blocks.push_back(register_module(
          "block" + std::to_string(i),
          torch::nn::Sequential(torch::nn::Linear(i == 0 ? 6 : 16, 16), torch::nn::BatchNorm1d(16),
                                torch::nn::ReLU(), torch::nn::Dropout(0.3))));
    }
    head = register_module("head", torch::nn::Linear(16, 2));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t u = 0; u < blocks.size(); ++u) {
      x = hetseq::run_unit(runner, u, [&] { return blocks[u]->forward(x); });
    }
    return head->forward(x);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() override {
    return {blocks[0].ptr(), blocks[1].ptr()};
  }
  void set_unit_runner(std::shared_ptr<hetseq::UnitRunner> r) override { runner = std::move(r); }

  std::vector<torch::nn::Sequential> blocks;
  torch::nn::Linear head{nullptr};
  std::shared_ptr<hetseq::UnitRunner> runner;
};

class BnUnitsTask : public hetseq::ModelTask<BnUnitsNetImpl> {
 public:
  explicit BnUnitsTask(int64_t points) : points_(points) {}
  std::shared_ptr<BnUnitsNetImpl> make_model() override { return std::make_shared<BnUnitsNetImpl>(); }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string& split) override {
    return std::make_shared<hetseq::test::PointsData>(split == "train" ? points_ : 30, 11);
  }
  hetseq::StepOutput loss(BnUnitsNetImpl& model, const hetseq::Batch& batch) override {
    return hetseq::test::points_loss(model.forward(batch.at("x")), batch);
  }

 private:
  int64_t points_;
};

hetseq::TaskSpec bn_units_spec() {
  hetseq::TaskSpec spec{"bn_units", "two units of Linear, BatchNorm, ReLU and dropout, and a head (a test's task library)"};
  spec.flags = [](hetseq::FlagSet& flags) { flags.add("points", "points in the train split", "100", "N"); };
  spec.defaults = {{"optimizer", "sgd"}, {"lr", "0.1"}, {"data", "-"}};
  spec.create = [](const hetseq::FlagValues& args, const hetseq::TaskContext&) {
    return std::make_unique<BnUnitsTask>(args.integer("points"));
  };
  return spec;
}
HETSEQ_REGISTER_TASK(bn_units, bn_units_spec);

}  // namespace
