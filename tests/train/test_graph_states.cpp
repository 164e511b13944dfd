// The Controller's captured updates (Note [CUDA-graph updates]) through a double of the capture object
// (tests/support/recording_graph_capture.h) on the CPU: the warm-ups, the capture and the replays in order, replays
// that train bit for bit as eager updates, a capture that fails in any way, and the values frozen at the capture
// (Note [Values frozen at capture]): a changed sample size or gradient is never replayed with; that update and the
// rest train eagerly, after one line that names the value.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/optim/adam.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/optim/sgd.h"
#include "hetseq/train/controller.h"
#include "support/recording_graph_capture.h"

using hetseq::Batch;
using hetseq::test::CaptureRecord;

namespace {

/// Two layers with dropout between them, so that a replay must draw the update's masks.
struct DropoutNet : torch::nn::Module {
  DropoutNet() {
    torch::manual_seed(3);
    first = register_module("first", torch::nn::Linear(4, 16));
    second = register_module("second", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return second->forward(torch::dropout(torch::tanh(first->forward(x)), 0.25, is_training()));
  }
  torch::nn::Linear first{nullptr}, second{nullptr};
};

/// Squared error summed over the batch. The sample size is the batch's sample count, or, where `sizes` is given,
/// its next entry at each step: a task whose sample size follows more than the batch's shape.
class GraphStatesTask final : public hetseq::Task {
 public:
  std::shared_ptr<torch::nn::Module> build_model() override { return std::make_shared<DropoutNet>(); }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string&) override {
    throw hetseq::InternalError("not used");
  }
  hetseq::StepOutput compute_loss(torch::nn::Module& model, const Batch& batch) override {
    hetseq::StepOutput out;
    out.loss = (dynamic_cast<DropoutNet&>(model).forward(batch.at("x")) - batch.at("y")).pow(2).sum();
    out.sample_size = static_cast<double>(batch.num_samples);
    if (next_ < sizes.size()) out.sample_size = sizes[next_++];
    return out;
  }
  std::vector<double> sizes;  // [step] the sample sizes to report; empty: the batch's sample count

 private:
  size_t next_ = 0;
};

/// Update `u`'s batch: `rows` rows of the same values whatever the run, `samples` of them counted.
Batch batch_of(int u, int64_t rows, int64_t samples) {
  torch::manual_seed(100 + static_cast<uint64_t>(u));
  Batch b;
  b.fields = {{"x", torch::randn({rows, 4})}, {"y", torch::randn({rows, 1})}};
  b.num_samples = samples;
  return b;
}

/// A Controller over DropoutNet with Adam and clip 0.5, in a world of one on the CPU; with `record`, --cuda-graph
/// through a RecordingGraphCapture that writes there.
struct Run {
  explicit Run(std::shared_ptr<CaptureRecord> record, std::vector<double> sizes = {}, bool sgd = false) {
    task.sizes = std::move(sizes);
    model = std::dynamic_pointer_cast<DropoutNet>(task.build_model());
    std::unique_ptr<hetseq::optim::Optimizer> optimizer;
    if (sgd) {
      hetseq::optim::SgdOptions o;
      o.lr = 1e-2;
      o.momentum = 0.9;
      optimizer = std::make_unique<hetseq::optim::Sgd>(model->parameters(), o);
    } else {
      // Device scalars, as --cuda-graph asks of Adam (Note [The step in a CUDA graph]), so that the eager run
      // steps with the same arithmetic.
      hetseq::optim::AdamOptions adam;
      adam.lr = 1e-2;
      adam.weight_decay = 0.01;
      adam.device_scalars = true;
      optimizer = std::make_unique<hetseq::optim::Adam>(model->parameters(), adam);
    }
    hetseq::optim::FixedOptions fixed;
    fixed.lrs = {1e-2};
    auto scheduler = std::make_unique<hetseq::optim::Fixed>(*optimizer, fixed);
    hetseq::ControllerOptions options;
    options.clip_norm = 0.5;
    options.seed = 7;
    if (record) {
      options.cuda_graph = true;
      options.graph_capture = hetseq::test::recording_graph_capture(record);
    }
    controller = std::make_unique<hetseq::Controller>(task, model, std::move(optimizer), std::move(scheduler),
                                                      std::make_shared<hetseq::LocalReducer>(), options);
    if (record) {
      // A capture on a device runs nothing: what its work changes here is put back.
      record->untouched = [this] {
        std::vector<torch::Tensor> out = model->parameters();
        for (const auto& t : controller->optimizer().step_tensors()) out.push_back(t);
        return out;
      };
    }
  }
  GraphStatesTask task;
  std::shared_ptr<DropoutNet> model;
  std::unique_ptr<hetseq::Controller> controller;
};

/// What the host holds that a replay depends on: the coming batch's sample count, the clip, the gradients' addresses.
std::string host_values(const int64_t& coming_samples, Run& run) {
  std::string out = "samples " + std::to_string(coming_samples) + " grads";
  for (const auto& p : run.model->parameters()) {
    out += " " + std::to_string(reinterpret_cast<uintptr_t>(p.grad().defined() ? p.grad().const_data_ptr() : nullptr));
  }
  return out;
}

bool same_parameters(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  bool same = pa.size() == pb.size();
  for (size_t i = 0; same && i < pa.size(); ++i) same = torch::equal(pa[i], pb[i]);
  return same;
}

bool same_state(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  bool same = a.size() == b.size();
  for (const auto& [name, value] : a) same = same && b.count(name) && torch::equal(value, b.at(name));
  return same;
}

std::vector<std::string> graph_lines(const std::vector<std::string>& lines) {
  std::vector<std::string> out;
  for (const auto& l : lines) {
    if (l.find("[cuda-graph]") != std::string::npos) out.push_back(l);
  }
  return out;
}

std::vector<std::string> calls(std::initializer_list<std::pair<const char*, int>> runs) {
  std::vector<std::string> out;
  for (const auto& [call, n] : runs) out.insert(out.end(), static_cast<size_t>(n), call);
  return out;
}

/// Trains `batches` through `graphed` (whose record learns each coming batch's sample count) and `eager` alike,
/// calling `between(u)` on both before update u; returns which of `graphed`'s updates were replays, [update].
template <class Between>
std::vector<bool> train_both(Run& graphed, Run& eager, CaptureRecord& record, const std::vector<Batch>& batches,
                             Between between) {
  int64_t coming = 0;
  record.host_values = [&] { return host_values(coming, graphed); };
  std::vector<bool> replayed;
  for (size_t u = 0; u < batches.size(); ++u) {
    between(graphed, u);
    between(eager, u);
    coming = batches[u].num_samples;
    replayed.push_back(graphed.controller->train_update({batches[u]}).replayed);
    CHECK_FALSE(eager.controller->train_update({batches[u]}).replayed);
  }
  graphed.controller->read_late_update();
  eager.controller->read_late_update();
  record.host_values = nullptr;
  return replayed;
}

void nothing_between(Run&, size_t) {}

}  // namespace

TEST_CASE("Captured updates through a recording double: three eager warm-ups, one capture, then replays that train bit "
          "for bit as eager updates, a batch of another shape eager in between",
          "[train][cuda-graph]") {
  // Adam's step in the graph, its count and scalars filled before each replay; SGD's eagerly after each replay.
  const bool sgd = GENERATE(false, true);
  INFO((sgd ? "sgd, stepped after each replay" : "adam, its step in the graph"));
  auto record = std::make_shared<CaptureRecord>();
  hetseq::log::begin_capture();
  Run graphed(record, {}, sgd), eager(nullptr, {}, sgd);
  std::vector<int64_t> steps_at_replay;  // [replay] the optimizer's step count when the replay starts
  record->on_replay = [&] { steps_at_replay.push_back(graphed.controller->optimizer().num_steps()); };
  std::vector<Batch> batches;  // [update] 8 rows each but the sixth's 5 (an epoch's short end)
  for (int u = 0; u < 9; ++u) batches.push_back(u == 5 ? batch_of(u, 5, 5) : batch_of(u, 8, 8));
  const std::vector<bool> replayed = train_both(graphed, eager, *record, batches, nothing_between);
  const std::vector<std::string> lines = graph_lines(hetseq::log::end_capture());
  CHECK(record->calls == calls({{"warm_up", 3}, {"capture", 1}, {"replay", 2}, {"replay", 3}}));
  CHECK(replayed == std::vector<bool>{false, false, false, true, true, false, true, true, true});
  CHECK(record->stale.empty());
  CHECK(same_parameters(*graphed.model, *eager.model));
  CHECK(graphed.controller->num_updates() == 9);
  CHECK(graphed.controller->optimizer().num_steps() == 9);
  CHECK(graphed.controller->optimizer().splits_step() == !sgd);
  // What a checkpoint saves: the counts, the learning rate and the buffers, as the eager run's.
  CHECK(same_state(graphed.controller->optimizer().state(), eager.controller->optimizer().state()));
  // Updates 4, 5, 7, 8, 9 replayed: Adam's step of update u is counted (and its scalars filled) before its replay.
  CHECK(steps_at_replay == (sgd ? std::vector<int64_t>{3, 4, 6, 7, 8} : std::vector<int64_t>{4, 5, 7, 8, 9}));
  REQUIRE(lines.size() == 3);
  CHECK_THAT(lines[0], Catch::Contains(sgd ? "3 eager warm-up updates, then forward, backward, clipping (not the "
                                             "optimizer step, which runs eagerly after each replay)"
                                           : "3 eager warm-up updates, then forward, backward, clipping and the "
                                             "optimizer step captured"));
  CHECK_THAT(lines[1], Catch::Contains("update 4 captured: 8 samples a batch"));
  CHECK_THAT(lines[2], Catch::Contains("update 6 has 1 micro-batch(es) of 5 samples, not one of the captured shape"));
}

TEST_CASE("Captured updates: a capture that fails in its work, at its end or with a throw of no std::exception trains "
          "eagerly from then on, after one line saying why",
          "[train][cuda-graph]") {
  const auto failure = GENERATE(CaptureRecord::Failure::kInWork, CaptureRecord::Failure::kAtEnd,
                                CaptureRecord::Failure::kNotStd);
  const std::string why = failure == CaptureRecord::Failure::kInWork  ? "operation not permitted when stream is capturing"
                          : failure == CaptureRecord::Failure::kAtEnd ? "capture_end: the capture was invalidated"
                                                                      : "an exception that is not a std::exception";
  INFO(why);
  auto record = std::make_shared<CaptureRecord>();
  record->failure = failure;
  hetseq::log::begin_capture();
  Run graphed(record), eager(nullptr);
  std::vector<Batch> batches;
  for (int u = 0; u < 6; ++u) batches.push_back(batch_of(u, 8, 8));
  const std::vector<bool> replayed = train_both(graphed, eager, *record, batches, nothing_between);
  const std::vector<std::string> lines = graph_lines(hetseq::log::end_capture());
  CHECK(record->calls == calls({{"warm_up", 3}, {"capture", 1}}));
  CHECK(replayed == std::vector<bool>(6, false));
  CHECK(same_parameters(*graphed.model, *eager.model));
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[1], Catch::Contains("[cuda-graph] not captured: the update could not be recorded (" + why +
                                       "); this update and every later one train uncaptured"));
}

TEST_CASE("Captured updates: a batch of the captured shape with another sample count is never replayed with the frozen "
          "divisor: it and the rest train eagerly, after one line naming the sample size",
          "[train][cuda-graph]") {
  auto record = std::make_shared<CaptureRecord>();
  hetseq::log::begin_capture();
  Run graphed(record), eager(nullptr);
  std::vector<Batch> batches;  // [update] 8 rows each; the sixth counts 6 of them (a task that pads its short end)
  for (int u = 0; u < 8; ++u) batches.push_back(batch_of(u, 8, u == 5 ? 6 : 8));
  const std::vector<bool> replayed = train_both(graphed, eager, *record, batches, nothing_between);
  const std::vector<std::string> lines = graph_lines(hetseq::log::end_capture());
  CHECK(record->calls == calls({{"warm_up", 3}, {"capture", 1}, {"replay", 2}}));
  CHECK(replayed == std::vector<bool>{false, false, false, true, true, false, false, false});
  CHECK(record->stale.empty());  // no replay saw a sample count other than the captured one
  CHECK(same_parameters(*graphed.model, *eager.model));
  REQUIRE(lines.size() == 3);
  CHECK_THAT(lines[2], Catch::Contains("[cuda-graph] update 6 is not replayed, since a value frozen at the capture "
                                       "changed: the sample size divisor, which follows the batch's sample count (8 at "
                                       "the capture, 6 now)"));
  CHECK_THAT(lines[2], Catch::Contains("this update and every later one train uncaptured"));
}

TEST_CASE("Captured updates: a task whose sample size changes within one shape and sample count is not captured, or "
          "not replayed, and says so once",
          "[train][cuda-graph]") {
  // The task's sample sizes, one a step: the change comes in the warm-ups (the third) or at the capture (the fourth).
  const bool at_capture = GENERATE(false, true);
  INFO((at_capture ? "changes at the capture" : "changes in the warm-ups"));
  const std::vector<double> sizes = at_capture ? std::vector<double>{8, 8, 8, 7, 8, 8} : std::vector<double>{8, 8, 7, 8, 8, 8};
  auto record = std::make_shared<CaptureRecord>();
  hetseq::log::begin_capture();
  Run graphed(record, sizes);
  // The eager run's task steps once an update; the graphed one's also at the capture, which the double runs.
  std::vector<double> eager_sizes = sizes;
  if (at_capture) eager_sizes.erase(eager_sizes.begin() + 3);
  Run eager(nullptr, eager_sizes);
  std::vector<Batch> batches;
  for (int u = 0; u < 5; ++u) batches.push_back(batch_of(u, 8, 8));
  const std::vector<bool> replayed = train_both(graphed, eager, *record, batches, nothing_between);
  const std::vector<std::string> lines = graph_lines(hetseq::log::end_capture());
  CHECK(replayed == std::vector<bool>(5, false));
  CHECK(same_parameters(*graphed.model, *eager.model));
  if (at_capture) {
    CHECK(record->calls == calls({{"warm_up", 3}, {"capture", 1}}));
  } else {
    CHECK(record->calls == calls({{"warm_up", 3}}));
  }
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[1], Catch::Contains(at_capture ? "(8 at update 3, 7 at update 4)" : "(8 at update 2, 7 at update 3)"));
  CHECK_THAT(lines[1], Catch::Contains("not captured: the task's sample size, the gradients' divisor, changed"));
}

TEST_CASE("Captured updates: gradients or optimizer state whose storage changed since the capture are never replayed "
          "into: that update and the rest train eagerly, after one line naming the tensor",
          "[train][cuda-graph]") {
  // Before update 7, a program gives the second parameter a gradient of its own (same values, other storage), or
  // restores the optimizer's state (Adam's buffers: new tensors of the same values).
  const bool gradient = GENERATE(true, false);
  INFO((gradient ? "a gradient replaced" : "the optimizer's state restored"));
  auto record = std::make_shared<CaptureRecord>();
  hetseq::log::begin_capture();
  Run graphed(record), eager(nullptr);
  std::vector<Batch> batches;
  for (int u = 0; u < 8; ++u) batches.push_back(batch_of(u, 8, 8));
  const auto replace = [gradient](Run& run, size_t u) {
    if (u != 6) return;
    if (gradient) {
      torch::Tensor p = run.model->parameters()[1];
      p.mutable_grad() = p.grad().clone();
      return;
    }
    std::map<std::string, torch::Tensor> state;
    for (const auto& [name, value] : run.controller->optimizer().state()) state[name] = value.clone();
    run.controller->optimizer().load_state(state);
  };
  const std::vector<bool> replayed = train_both(graphed, eager, *record, batches, replace);
  const std::vector<std::string> lines = graph_lines(hetseq::log::end_capture());
  CHECK(record->calls == calls({{"warm_up", 3}, {"capture", 1}, {"replay", 3}}));
  CHECK(replayed == std::vector<bool>{false, false, false, true, true, true, false, false});
  CHECK(record->stale.empty());
  CHECK(same_parameters(*graphed.model, *eager.model));
  REQUIRE(lines.size() == 3);
  CHECK_THAT(lines[2], Catch::Contains(gradient ? "[cuda-graph] update 7 is not replayed, since a value frozen at the "
                                                  "capture changed: the data pointer of gradient 1 of 4"
                                                : "[cuda-graph] update 7 is not replayed, since a value frozen at the "
                                                  "capture changed: the data pointer of optimizer state tensor 0 of"));
}

TEST_CASE("Frozen values name the first that changed, with both values", "[train][cuda-graph]") {
  hetseq::FrozenValues frozen;
  frozen.fields = "x Float[8, 4]";
  frozen.num_samples = 8;
  frozen.sample_size = 8;
  frozen.clip_norm = 0.5;
  int a = 0, b = 0;
  frozen.gradients = {&a, &b};
  frozen.parameters = {&a};
  CHECK_FALSE(hetseq::changed_value(frozen, frozen));
  auto now = frozen;
  now.clip_norm = 1;
  CHECK(*hetseq::changed_value(frozen, now) == "the clip value, --clip-norm (0.5 at the capture, 1 now)");
  now = frozen;
  now.sample_size = 7;
  CHECK(*hetseq::changed_value(frozen, now) == "the sample size divisor (8 at the capture, 7 now)");
  now = frozen;
  now.gradients = {&a};
  CHECK(*hetseq::changed_value(frozen, now) == "the number of gradients (2 at the capture, 1 now)");
  now = frozen;
  now.parameters = {&b};
  CHECK_THAT(*hetseq::changed_value(frozen, now), Catch::StartsWith("the data pointer of parameter 0 of 1 ("));
  now = frozen;
  now.fields = "x Float[5, 4]";
  CHECK(*hetseq::changed_value(frozen, now) == "the batch's shape (x Float[8, 4] at the capture, x Float[5, 4] now)");
}
