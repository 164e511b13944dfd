// Mixed precision inside one process: the dynamic loss scaler's schedule, the autocast guard, and the
// Controller with a loss scale (exactness of the weighted average, skipped updates on overflow) on the
// real mnist task and random IDX files. See Note [Loss scaling].
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/autocast_mode.h>
#ifdef HETSEQ_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "cuda/cuda_skip.h"
#include "cuda/sync_counter.h"
#include "hetseq/core/error.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/optim/sgd.h"
#include "hetseq/train/controller.h"
#include "hetseq/train/loss_scaler.h"
#include "hetseq/train/precision.h"
#include "support/tensor_lists.h"
#include "support/error_message.h"
#include "support/loss_scaler_steps.h"
#include "support/mnist_files.h"
#include "support/temp_dir.h"
#include "tasks/mnist/mnist_task.h"

using Catch::Contains;
using hetseq::DynamicLossScaler;
using hetseq::LossScalerOptions;
using hetseq::Precision;
using hetseq::test::error_of;
using hetseq::test::scaler_options;
using hetseq::test::scales_after;
using hetseq::test::TempDir;

TEST_CASE("the loss scale doubles after a window without overflow and halves on overflow", "[precision]") {
  DynamicLossScaler s(scaler_options(8, 3));
  CHECK(s.scale() == 8);
  CHECK(scales_after(s, {0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0}) == std::vector<double>{8, 8, 16, 16, 8, 8, 8, 4, 4, 4, 8});
  CHECK(s.overflows() == 2);
}

TEST_CASE("the loss scale schedule honours tolerance, threshold and the minimum", "[precision]") {
  SECTION("tolerance: the scale halves only when overflows reach the share since the last move") {
    LossScalerOptions o = scaler_options(8, 100);
    o.tolerance = 0.5;
    DynamicLossScaler s(o);
    // 1 of 2 (0.5): halve; then 1 of 3, 2 of 4 (0.5): halve.
    CHECK(scales_after(s, {0, 1, 0, 0, 1, 1}) == std::vector<double>{8, 4, 4, 4, 4, 2});
  }
  SECTION("threshold: never below it") {
    LossScalerOptions o = scaler_options(16, 100);
    o.threshold = 4;
    DynamicLossScaler s(o);
    CHECK(scales_after(s, {1, 1, 1, 1}) == std::vector<double>{8, 4, 4, 4});
  }
  SECTION("minimum: falling below it is an error that says what to do") {
    LossScalerOptions o = scaler_options(1, 100);
    o.min_scale = 0.25;
    DynamicLossScaler s(o);
    CHECK(scales_after(s, {1, 1}) == std::vector<double>{0.5, 0.25});
    const std::string message = error_of<hetseq::InputError>([&] { s.update(true); });
    CHECK_THAT(message, Contains("--min-loss-scale") && Contains("diverging") && Contains("--lr"));
  }
}

TEST_CASE("a restored loss scaler continues the schedule of the saved one", "[precision]") {
  DynamicLossScaler a(scaler_options(64, 3));
  scales_after(a, {0, 0, 1, 0});  // mid-window: the counters matter, not only the scale
  DynamicLossScaler b(scaler_options(64, 3));
  b.load_state(a.state(), "test");
  CHECK(b.state() == a.state());
  const std::vector<int> next{0, 0, 1, 0, 0, 0};
  CHECK(scales_after(b, next) == scales_after(a, next));

  auto bad = a.state();
  bad["scale"] = 3;
  CHECK_THAT(error_of<hetseq::InputError>([&] { b.load_state(bad, "ck.pt"); }),
             Contains("ck.pt") && Contains("power of two"));
  bad.erase("scale");
  CHECK_THAT(error_of<hetseq::InputError>([&] { b.load_state(bad, "ck.pt"); }), Contains("'scale'"));
}

TEST_CASE("invalid loss scaling options name their flag", "[precision]") {
  auto message = [](LossScalerOptions o) { return error_of<hetseq::UsageError>([&] { o.validate(); }); };
  LossScalerOptions o;
  o.init_scale = 100;
  CHECK_THAT(message(o), Contains("--fp16-init-scale") && Contains("power of two"));
  o = {};
  o.scale_window = 0;
  CHECK_THAT(message(o), Contains("--fp16-scale-window"));
  o = {};
  o.tolerance = -0.1;
  CHECK_THAT(message(o), Contains("--fp16-scale-tolerance"));
  o = {};
  o.threshold = 6;
  CHECK_THAT(message(o), Contains("--threshold-loss-scale"));
  o = {};
  o.min_scale = 0;
  CHECK_THAT(message(o), Contains("--min-loss-scale"));
}

TEST_CASE("AutocastGuard runs CPU matrix products in bf16 or fp16, turns autocast off inside, restores it", "[precision]") {
  torch::manual_seed(1);
  torch::nn::Linear linear(8, 4);
  const torch::Tensor x = torch::randn({3, 8});
  REQUIRE(!at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
  for (const auto& [precision, dtype] : std::vector<std::pair<Precision, torch::ScalarType>>{
           {Precision::kBFloat16, torch::kBFloat16}, {Precision::kFloat16, torch::kHalf}}) {
    {
      const hetseq::AutocastGuard autocast(torch::kCPU, precision);
      CHECK(linear(x).scalar_type() == dtype);
      {
        const hetseq::AutocastGuard off(torch::kCPU, Precision::kFloat32);
        CHECK(linear(x).scalar_type() == torch::kFloat32);
      }
      CHECK(linear(x).scalar_type() == dtype);
    }
    CHECK(linear(x).scalar_type() == torch::kFloat32);
    CHECK(!at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
  }
}

namespace {

// One Controller on the mnist task over random IDX files, SGD with momentum, the default dropout.
struct Trainer {
  std::shared_ptr<hetseq::mnist::MnistTask> task;
  std::shared_ptr<hetseq::Dataset> data;
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<hetseq::Controller> controller;

  Trainer(const std::string& dir, Precision precision, std::optional<LossScalerOptions> scaling,
          torch::Device device = torch::kCPU) {
    hetseq::mnist::MnistTaskOptions options;
    options.data_dir = dir;
    task = std::make_shared<hetseq::mnist::MnistTask>(options);
    data = task->load_dataset("train");
    torch::manual_seed(3);
    model = task->build_model();
    model->to(device);
    hetseq::optim::SgdOptions sgd;
    sgd.lr = 0.05;
    sgd.momentum = 0.9;
    auto optimizer = std::make_unique<hetseq::optim::Sgd>(model->parameters(), sgd);
    hetseq::optim::FixedOptions fixed;
    fixed.lrs = {0.05};
    auto scheduler = std::make_unique<hetseq::optim::Fixed>(*optimizer, fixed);
    hetseq::ControllerOptions c;
    c.seed = 7;
    c.precision = precision;
    c.loss_scaling = scaling;
    c.device = device;
    controller = std::make_unique<hetseq::Controller>(*task, model, std::move(optimizer), std::move(scheduler),
                                                      std::make_shared<hetseq::LocalReducer>(), c);
  }

  // Update `u`: two micro-batches of 5 and 11 samples (unequal, as on unequal ranks).
  hetseq::UpdateResult update(int64_t u) {
    std::vector<int64_t> a, b;
    for (int64_t i = 0; i < 16; ++i) (i < 5 ? a : b).push_back((u * 16 + i) % data->size());
    return controller->train_update({data->collate(a), data->collate(b)});
  }

  std::vector<torch::Tensor> params() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  }

  // Samples 0..15 as `parts` micro-batches (sample i in micro-batch i % parts), pinned when `pin`, as the
  // BatchLoader gives them on a CUDA rank.
  std::vector<hetseq::Batch> split(int64_t parts, bool pin = false) const {
    std::vector<hetseq::Batch> batches;
    for (int64_t m = 0; m < parts; ++m) {
      std::vector<int64_t> rows;
      for (int64_t i = m; i < 16; i += parts) rows.push_back(i);
      batches.push_back(pin ? data->collate(rows).pin_memory() : data->collate(rows));
    }
    return batches;
  }
};

}  // namespace

TEST_CASE("a power-of-two loss scale leaves fp32 training bit-identical: the weighted average stays exact (and the "
          "update read late equals the one read at once)",
          "[precision]") {
  TempDir dir;
  hetseq::test::write_random_mnist(dir.path(), 96, 8, 5);
  Trainer plain(dir.path(), Precision::kFloat32, std::nullopt);
  Trainer scaled(dir.path(), Precision::kFloat32, scaler_options(1024, 2));  // the scale moves: 1024, 2048, 4096
  REQUIRE(hetseq::test::all_equal(plain.params(), scaled.params()));
  for (int64_t u = 0; u < 5; ++u) {
    // Without loss scaling the update's values are read after it (Note [Reading an update late]); the clip
    // decided on the device must equal the one decided on the host.
    REQUIRE(plain.update(u).late);
    const auto p = plain.controller->read_late_update().value();
    const auto s = scaled.update(u);
    INFO("update " << u);
    REQUIRE(!s.skipped);
    CHECK(s.gnorm == p.gnorm);  // equal, not close
    CHECK(s.sums == p.sums);
  }
  CHECK(scaled.controller->loss_scaler()->scale() == 4096);
  CHECK(hetseq::test::all_equal(plain.params(), scaled.params()));
}

TEST_CASE("an update that overflows in fp16 is skipped: no step, no count, half the scale", "[precision]") {
  TempDir dir;
  hetseq::test::write_random_mnist(dir.path(), 96, 8, 6);
  // 2^30 times the loss overflows float16 (largest 65504) in the backward pass of the first layer hit.
  Trainer t(dir.path(), Precision::kFloat16, scaler_options(std::ldexp(1.0, 30), 1000));
  const auto before = t.params();
  const auto first = t.update(0);
  CHECK(first.skipped);
  CHECK(!std::isfinite(first.gnorm));
  CHECK(first.loss_scale == std::ldexp(1.0, 30));
  CHECK(t.controller->num_updates() == 0);
  CHECK(t.controller->loss_scaler()->scale() == std::ldexp(1.0, 29));
  CHECK(hetseq::test::all_equal(before, t.params()));
  for (const auto& p : t.model->parameters()) CHECK((!p.grad().defined() || p.grad().abs().sum().item<double>() == 0));

  int64_t u = 1;
  hetseq::UpdateResult r;
  do {
    r = t.update(u++);
  } while (r.skipped && u < 40);
  INFO("first applied update after " << u - 1 << " tries, scale " << r.loss_scale);
  REQUIRE(!r.skipped);
  CHECK(std::isfinite(r.gnorm));
  CHECK(r.loss_scale <= 65504);  // a float16 gradient of at least 1 per unit loss fits
  CHECK(t.controller->num_updates() == 1);
  CHECK(t.controller->loss_scaler()->overflows() == u - 1);  // every try but the last overflowed
  CHECK(!hetseq::test::all_equal(before, t.params()));
  const auto stats = t.controller->train_stats();
  CHECK(std::any_of(stats.begin(), stats.end(), [&](const hetseq::Stat& s) {
    return s.name == "loss_scale" && s.value == r.loss_scale;
  }));
}

// bf16 training is checked end to end, with validation accuracy, in test_mixed_precision_cli.cpp.
TEST_CASE("fp16 autocast with a loss scale trains the mnist model on the CPU", "[precision]") {
  TempDir dir;
  hetseq::test::write_random_mnist(dir.path(), 32, 8, 7);
  Trainer t(dir.path(), Precision::kFloat16, scaler_options(128, 2000));
  // The same 32 samples again and again: the loss must fall (memorisation).
  double first = 0, last = 0;
  for (int64_t u = 0; u < 22; ++u) {
    const auto r = t.update(u % 2);
    REQUIRE(!r.skipped);
    const double loss = r.sums.at("loss") / r.sums.at("sample_size");
    if (u < 2) first += loss / 2;
    if (u >= 20) last += loss / 2;
  }
  INFO("mean loss of the first two updates " << first << ", of the last two " << last);
  CHECK(last < 0.5 * first);
}

TEST_CASE("an update reads the device after the next one, however many micro-batches, and twice under loss scaling",
          "[precision][stats]") {
  // See Note [Statistics on the device] and Note [Reading an update late].
  TempDir dir;
  hetseq::test::write_random_mnist(dir.path(), 32, 8, 7);
  for (const bool scaling : {false, true}) {
    INFO((scaling ? "fp32 with loss scaling" : "fp32"));
    Trainer t(dir.path(), Precision::kFloat32, scaling ? scaler_options(128, 2000) : std::optional<LossScalerOptions>());
    for (const int64_t parts : {1, 2, 4}) {
      INFO(parts << " micro-batches");
      const auto returned = t.controller->train_update(t.split(parts));
      // Without loss scaling the statistics and the norm stay on the device until read; with it, the skip
      // decision needs the norm at once, and the statistics come with it.
      CHECK(returned.late == !scaling);
      CHECK(returned.host_reads == (scaling ? 2 : 0));
      const auto read = t.controller->read_late_update();
      CHECK(read.has_value() == !scaling);
      const hetseq::UpdateResult& r = scaling ? returned : *read;
      CHECK(r.sums.at("sample_size") == 16);
      CHECK(hetseq::MetricSums(r.sums)[hetseq::metrics::kNsentences] == 16);  // MNIST counts sentences as samples
      CHECK(std::isfinite(r.sums.at("loss")));
      CHECK(r.sums.at("loss") > 0);
      CHECK(r.sums.at("ncorrect") >= 0);
      CHECK(r.sums.at("ncorrect") <= 16);
      CHECK(r.sums.at("ncorrect") == std::round(r.sums.at("ncorrect")));
      CHECK(std::isfinite(r.gnorm));
    }
  }
}

// The CPU test above takes the Controller's own count of its reads (tests/bert/test_bert_update.cpp counts them
// through the dispatcher); here CUDA counts every host sync from outside, batches' copies to the device included:
// pinned, as the loader gives them on a CUDA rank, they go asynchronously (unpinned, each tensor's copy would
// sync: 2 more per micro-batch, as seen on an H100). In the steady state an update syncs not at all (Note [Reading
// an update late]; the wait for the previous update's event is no sync to the debug mode, and that update has
// long finished), and twice under loss scaling, whose skip decision the host needs at once.
TEST_CASE("CUDA: an update syncs with the device not at all in the steady state, twice under loss scaling, "
          "however many micro-batches, counted by CUDA's sync debug mode",
          "[cuda][precision][stats]") {
  if (!hetseq::test::cuda_or_skip()) return;
#ifdef HETSEQ_WITH_CUDA
  TempDir dir;
  hetseq::test::write_random_mnist(dir.path(), 32, 8, 7);
  for (const auto& [precision, scaling] : std::vector<std::pair<Precision, std::optional<LossScalerOptions>>>{
           {Precision::kFloat32, std::nullopt}, {Precision::kFloat16, scaler_options(128, 2000)}}) {
    INFO(hetseq::to_string(precision));
    Trainer t(dir.path(), precision, scaling, torch::Device(torch::kCUDA, 0));
    t.update(0);  // the first update allocates the optimizer's buffers and warms the allocator
    for (const int64_t parts : {1, 2, 4}) {
      INFO(parts << " micro-batches");
      const std::vector<hetseq::Batch> batches = t.split(parts, /*pin=*/true);
      torch::cuda::synchronize();
      hetseq::test::SyncCounter counter;
      const auto r = t.controller->train_update(batches);
      const int64_t syncs = counter.syncs;
      const int64_t expected = scaling ? 2 : 0;
      CHECK(syncs == expected);
      CHECK(r.host_reads == expected);
      CHECK(r.sums.at("sample_size") == 16);
    }
  }
#endif
}
