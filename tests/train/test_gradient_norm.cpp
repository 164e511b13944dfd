// The Controller's normalisation, gradient norm and clipping through foreach kernels (Note [Gradient norm
// in one pass]) against the per-tensor pass they replaced, written out here: on a CPU the gnorm, the clipped
// gradients and so the parameters must be bit-equal to it, for a model with gradients of two dtypes (two
// groups, whose norms are combined in parameter order) and a parameter that takes no gradient.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/optim/sgd.h"
#include "hetseq/train/controller.h"
#include "support/error_message.h"

using hetseq::Batch;
using torch::Tensor;

namespace {

/// fp32 first layer, fp64 second layer, and an fp32 parameter that the forward pass never uses.
struct TwoDtypeNet : torch::nn::Module {
  explicit TwoDtypeNet(uint64_t seed) {
    torch::manual_seed(seed);
    first = register_module("first", torch::nn::Linear(6, 16));
    second = register_module("second", torch::nn::Linear(16, 3));
    second->to(torch::kFloat64);
    unused = register_parameter("unused", torch::randn({4}));
  }
  Tensor forward(const Tensor& x) {
    return second->forward(torch::tanh(first->forward(x.to(torch::kFloat32))).to(torch::kFloat64));
  }
  torch::nn::Linear first{nullptr}, second{nullptr};
  Tensor unused;
};

/// Squared error summed over the batch; the sample size is the number of samples.
class NormRegressionTask final : public hetseq::Task {
 public:
  std::shared_ptr<torch::nn::Module> build_model() override { throw hetseq::InternalError("not used"); }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string&) override {
    throw hetseq::InternalError("not used");
  }
  hetseq::StepOutput compute_loss(torch::nn::Module& model, const Batch& batch) override {
    hetseq::StepOutput out;
    out.loss = loss_of(dynamic_cast<TwoDtypeNet&>(model), batch);
    out.sample_size = static_cast<double>(batch.num_samples);
    out.log = {{"loss", out.loss.item<double>()}};
    return out;
  }
  static Tensor loss_of(TwoDtypeNet& model, const Batch& batch) {
    return (model.forward(batch.at("x")) - batch.at("y")).pow(2).sum();
  }
};

Batch make_batch(uint64_t seed, int64_t size, double x_scale, double y_scale = 1) {
  torch::manual_seed(seed);
  Batch b;
  b.fields = {{"x", torch::randn({size, 6}, torch::kFloat64) * x_scale},
              {"y", torch::randn({size, 3}, torch::kFloat64) * y_scale}};
  b.num_samples = size;
  return b;
}

constexpr double kLr = 0.1;

std::unique_ptr<hetseq::Controller> make_controller(hetseq::Task& task, const std::shared_ptr<TwoDtypeNet>& model,
                                                    double clip_norm) {
  hetseq::optim::SgdOptions sgd;
  sgd.lr = kLr;
  auto optimizer = std::make_unique<hetseq::optim::Sgd>(model->parameters(), sgd);
  hetseq::optim::FixedOptions fixed;
  fixed.lrs = {kLr};
  auto scheduler = std::make_unique<hetseq::optim::Fixed>(*optimizer, fixed);
  hetseq::ControllerOptions options;
  options.clip_norm = clip_norm;
  return std::make_unique<hetseq::Controller>(task, model, std::move(optimizer), std::move(scheduler),
                                              std::make_shared<hetseq::LocalReducer>(), options);
}

/// The pass before foreach kernels, one tensor at a time: g /= N, the float64 norm of each, their norm,
/// and g *= clip / (norm + 1e-6) when the norm exceeds `clip_norm`; then SGD's step. Returns the norm.
double per_tensor_update(TwoDtypeNet& model, const std::vector<Batch>& micro_batches, double clip_norm) {
  model.zero_grad();
  double n = 0;
  for (const auto& b : micro_batches) {
    NormRegressionTask::loss_of(model, b).backward();
    n += static_cast<double>(b.num_samples);
  }
  torch::NoGradGuard no_grad;
  std::vector<Tensor> grads, norms;
  for (auto& p : model.parameters()) {
    if (!p.grad().defined()) continue;
    p.mutable_grad().div_(n);
    grads.push_back(p.grad());
    norms.push_back(p.grad().to(torch::kFloat64).norm());
  }
  const double norm = torch::stack(norms).norm().item<double>();
  if (clip_norm > 0 && norm > clip_norm) {
    for (auto& g : grads) g.mul_(clip_norm / (norm + 1e-6));
  }
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) p.add_(p.grad(), -kLr);
  }
  return norm;
}

bool all_equal(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.parameters();
  const auto pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!torch::equal(pa[i], pb[i])) return false;
  }
  return pa.size() == pb.size();
}

}  // namespace

TEST_CASE("The gradient norm and clipping through foreach kernels, decided on the device and read late, are "
          "bit-equal to the per-tensor pass",
          "[train][gnorm]") {
  // 0: no clipping; 5: clips the first updates (gnorm about 10..20) and not the later ones.
  const double clip_norm = GENERATE(0.0, 5.0);
  INFO("--clip-norm " << clip_norm);
  NormRegressionTask task;
  auto model = std::make_shared<TwoDtypeNet>(11);
  TwoDtypeNet reference(11);
  REQUIRE(all_equal(*model, reference));
  auto controller = make_controller(task, model, clip_norm);
  int clipped = 0;
  for (int u = 0; u < 6; ++u) {
    INFO("update " << u);
    const std::vector<Batch> micro_batches{make_batch(100 + u, 3, 4.0), make_batch(200 + u, 7, 4.0)};
    const hetseq::UpdateResult late = controller->train_update(micro_batches);
    // Note [Reading an update late]: the update read nothing; its norm comes after.
    CHECK(late.late);
    CHECK(std::isnan(late.gnorm));
    CHECK(late.host_reads == 0);
    const std::optional<hetseq::UpdateResult> result = controller->read_late_update();
    REQUIRE(result);
    CHECK(!controller->read_late_update());  // read once
    const double expected = per_tensor_update(reference, micro_batches, clip_norm);
    CHECK(result->gnorm == expected);  // equal, not close
    CHECK(result->clipped == (clip_norm > 0 && expected > clip_norm));
    CHECK(!result->late);
    clipped += result->clipped ? 1 : 0;
    CHECK(!model->unused.grad().defined());
    REQUIRE(all_equal(*model, reference));
  }
  if (clip_norm > 0) CHECK(clipped > 0);
}

TEST_CASE("A non-finite gradient norm without loss scaling stops the run with the reason", "[train][gnorm]") {
  NormRegressionTask task;
  auto model = std::make_shared<TwoDtypeNet>(12);
  auto controller = make_controller(task, model, 0);
  // Targets of 1e200 give the fp64 layer gradients of about 1e200, which overflow to inf when they reach the
  // fp32 layer: its gradients, and so the norm, are not finite.
  // The norm is read after the update (Note [Reading an update late]): the error comes with the read, which
  // the next update, the log and a checkpoint's state make.
  const hetseq::UpdateResult late = controller->train_update({make_batch(1, 4, 1, 1e200)});
  CHECK(late.late);
  const std::string message = hetseq::test::error_of<hetseq::InputError>([&] { controller->state(); });
  CHECK_THAT(message, Catch::Contains("update 1: the gradient norm is") && Catch::Contains("lower --lr"));
}
