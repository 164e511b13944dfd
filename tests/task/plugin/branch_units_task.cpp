// A task library for --user-dir (target hetseq_test_branch_units_plugin) whose model takes a branch that the data
// decides: unit 1 adds `extra` only for a batch whose first point has a positive first coordinate, so in an update
// some ranks give `extra` a gradient and others none. Under --zero-sharding none that needs
// --find-unused-parameters; os+grad and full must either train it exactly or refuse it with a line naming the
// parameter (Note [Parameters without a gradient] in hetseq/shard/shard_reducer.cpp).
#include <hetseq/hetseq.h>
#include <hetseq/task/model_units.h>

#include "points_data.h"

namespace {

struct BranchBlockImpl : torch::nn::Module {
  BranchBlockImpl() {
    body = register_module("body", torch::nn::Linear(16, 16));
    extra = register_module("extra", torch::nn::Linear(16, 16));
  }
  torch::Tensor forward(torch::Tensor x, bool take_extra) {
    x = torch::relu(body->forward(x));
    return take_extra ? x + extra->forward(x) : x;
  }
  torch::nn::Linear body{nullptr}, extra{nullptr};
};
TORCH_MODULE(BranchBlock);

struct BranchUnitsNetImpl : torch::nn::Module, hetseq::ShardableModel {
  BranchUnitsNetImpl() {
    first = register_module("first", torch::nn::Linear(6, 16));
    branch = register_module("branch", BranchBlock());
    head = register_module("head", torch::nn::Linear(16, 2));
  }
  torch::Tensor forward(const torch::Tensor& input) {
    // The branch: read on the host from the batch, so that ranks with other batches decide otherwise.
    const bool take_extra = input[0][0].item<double>() > 0;
    torch::Tensor x = hetseq::run_unit(runner, 0, [&] { return torch::relu(first->forward(input)); });
    x = hetseq::run_unit(runner, 1, [&] { return branch->forward(x, take_extra); });
    return head->forward(x);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() override { return {first.ptr(), branch.ptr()}; }
  void set_unit_runner(std::shared_ptr<hetseq::UnitRunner> r) override { runner = std::move(r); }

  torch::nn::Linear first{nullptr};
  BranchBlock branch{nullptr};
  torch::nn::Linear head{nullptr};
  std::shared_ptr<hetseq::UnitRunner> runner;
};

class BranchUnitsTask : public hetseq::ModelTask<BranchUnitsNetImpl> {
 public:
  explicit BranchUnitsTask(int64_t points) : points_(points) {}
  std::shared_ptr<BranchUnitsNetImpl> make_model() override { return std::make_shared<BranchUnitsNetImpl>(); }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string& split) override {
    return std::make_shared<hetseq::test::PointsData>(split == "train" ? points_ : 30, 13);
  }
  hetseq::StepOutput loss(BranchUnitsNetImpl& model, const hetseq::Batch& batch) override {
    return hetseq::test::points_loss(model.forward(batch.at("x")), batch);
  }

 private:
  int64_t points_;
};

hetseq::TaskSpec branch_units_spec() {
  hetseq::TaskSpec spec{"branch_units", "two units, the second with a branch the data decides (a test's task library)"};
  spec.flags = [](hetseq::FlagSet& flags) { flags.add("points", "points in the train split", "120", "N"); };
  spec.defaults = {{"optimizer", "sgd"}, {"lr", "0.1"}, {"data", "-"}};
  spec.create = [](const hetseq::FlagValues& args, const hetseq::TaskContext&) {
    return std::make_unique<BranchUnitsTask>(args.integer("points"));
  };
  return spec;
}
HETSEQ_REGISTER_TASK(branch_units, branch_units_spec);

}  // namespace
