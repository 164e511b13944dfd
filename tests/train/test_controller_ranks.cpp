// The Controller over a DistributedReducer, with ranks as threads sharing a store and real Gloo groups
// (level 1 of STYLE's test levels; see support/rank_threads.h): empty micro-batches run by the
// Controller (Note [Empty micro-batches]), parameters that no rank uses (Note [Bucketed reduction]),
// and buffers broadcast from rank 0 before each update.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/channel/group_channel.h"
#include "hetseq/optim/adam.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/optim/sgd.h"
#include "hetseq/train/controller.h"
#include "support/tensor_lists.h"
#include "support/rank_threads.h"

using hetseq::Batch;
using hetseq::DdpOptions;
using hetseq::LogSums;
using hetseq::test::Group;
using hetseq::test::OneIntraOpThread;
using hetseq::test::run_ranks;

namespace {

/// A model for RegressionTask: a forward pass from inputs [n, 4] to outputs [n, 3].
struct Net : torch::nn::Module {
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

/// Squared error summed over the batch; its sample size is the number of samples. Counts its calls and
/// throws when it gets an empty batch, which the Controller must never pass.
class RegressionTask : public hetseq::Task {
 public:
  std::shared_ptr<torch::nn::Module> build_model() override { throw hetseq::InternalError("not used"); }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string&) override {
    throw hetseq::InternalError("not used");
  }
  hetseq::StepOutput compute_loss(torch::nn::Module& model, const Batch& batch) override {
    if (batch.empty()) throw hetseq::InternalError("the task was called with an empty batch");
    ++calls;
    const torch::Tensor error = dynamic_cast<Net&>(model).forward(batch.at("x")) - batch.at("y");
    hetseq::StepOutput out;
    out.loss = error.pow(2).sum();
    out.sample_size = static_cast<double>(batch.num_samples);
    out.log = {{"loss", out.loss.item<double>()}, {"nsentences", out.sample_size}};
    return out;
  }
  int64_t calls = 0;
};

Batch make_batch(uint64_t seed, int64_t size) {
  torch::manual_seed(seed);
  const auto options = torch::TensorOptions().dtype(torch::kFloat64);
  Batch b;
  b.fields = {{"x", torch::randn({size, 4}, options)}, {"y", torch::randn({size, 3}, options)}};
  b.num_samples = size;
  return b;
}

Batch concat(const std::vector<Batch>& batches) {
  std::vector<torch::Tensor> xs, ys;
  int64_t n = 0;
  for (const auto& b : batches) {
    xs.push_back(b.at("x"));
    ys.push_back(b.at("y"));
    n += b.num_samples;
  }
  Batch out;
  out.fields = {{"x", torch::cat(xs)}, {"y", torch::cat(ys)}};
  out.num_samples = n;
  return out;
}

std::vector<torch::Tensor> values_of(torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, ((a[i] - b[i]).abs() / (1 + b[i].abs())).max().item<double>());
  }
  return worst;
}

/// A Controller with SGD (lr 0.1) or Adam, a fixed learning rate and no clipping.
std::unique_ptr<hetseq::Controller> make_controller(hetseq::Task& task, const std::shared_ptr<Net>& model,
                                                    std::shared_ptr<hetseq::GradientReducer> reducer,
                                                    std::shared_ptr<hetseq::CollectiveChannel> channel,
                                                    std::unique_ptr<hetseq::optim::Optimizer> optimizer = nullptr) {
  if (!optimizer) {
    hetseq::optim::SgdOptions sgd;
    sgd.lr = 0.1;
    optimizer = std::make_unique<hetseq::optim::Sgd>(model->parameters(), sgd);
  }
  hetseq::optim::FixedOptions fixed;
  fixed.lrs = {optimizer->lr()};
  auto scheduler = std::make_unique<hetseq::optim::Fixed>(*optimizer, fixed);
  hetseq::ControllerOptions options;
  options.clip_norm = 0;
  return std::make_unique<hetseq::Controller>(task, model, std::move(optimizer), std::move(scheduler),
                                              std::move(reducer), options, std::move(channel));
}

struct Mlp : Net {
  explicit Mlp(uint64_t seed) {
    torch::manual_seed(seed);
    first = register_module("first", torch::nn::Linear(4, 8));
    second = register_module("second", torch::nn::Linear(8, 3));
    to(torch::kFloat64);
  }
  torch::Tensor forward(const torch::Tensor& x) override { return second->forward(torch::tanh(first->forward(x))); }
  torch::nn::Linear first{nullptr}, second{nullptr};
};

}  // namespace

TEST_CASE("Empty micro-batches are run by the Controller: ranks with short and empty slices give the oracle's "
          "update, with and without fast stat sync",
          "[ddp][controller]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  // [update][rank][micro-batch] sample counts: in update 0 rank 1 has an empty micro-batch and rank 2
  // only empty ones (the end of an epoch); every rank runs two micro-batches (Note [Data plan]).
  const std::vector<std::vector<std::vector<int64_t>>> sizes{{{4, 3}, {2, 0}, {0, 0}}, {{1, 2}, {3, 1}, {2, 2}}};
  std::vector<std::vector<std::vector<Batch>>> batches(sizes.size());  // [update][rank][micro-batch]
  for (size_t u = 0; u < sizes.size(); ++u) {
    for (int r = 0; r < kWorld; ++r) {
      batches[u].emplace_back();
      for (size_t k = 0; k < 2; ++k) batches[u][r].push_back(make_batch(100 * u + 10 * r + k, sizes[u][r][k]));
    }
  }

  // The oracle: one process, one micro-batch of all of the update's samples.
  RegressionTask oracle_task;
  auto oracle_model = std::make_shared<Mlp>(7);
  auto oracle = make_controller(oracle_task, oracle_model, std::make_shared<hetseq::LocalReducer>(), nullptr);
  std::vector<std::vector<torch::Tensor>> expected;  // [update] parameters after it
  std::vector<LogSums> expected_sums;                // [update]
  for (const auto& update : batches) {
    std::vector<Batch> all;
    for (const auto& rank : update) {
      for (const auto& b : rank) {
        if (!b.empty()) all.push_back(b);
      }
    }
    expected_sums.push_back(oracle->train_update({concat(all)}).sums);
    expected.push_back(values_of(*oracle_model));
  }

  for (bool fast : {false, true}) {
    CAPTURE(fast);
    std::vector<RegressionTask> tasks(kWorld);
    std::vector<std::vector<std::vector<torch::Tensor>>> params(kWorld);  // [rank][update][param]
    std::vector<std::vector<LogSums>> sums(kWorld);                      // [rank][update]
    // Built here, not in the rank threads: initialisation draws from the one global generator.
    std::vector<std::shared_ptr<Mlp>> models;
    for (int r = 0; r < kWorld; ++r) models.push_back(std::make_shared<Mlp>(r == 0 ? 7 : 70 + r));  // rank 0's win
    run_ranks(kWorld, [&](int rank, const Group& group) {
      const auto& model = models[rank];
      auto controller = make_controller(tasks[rank], model,
                                        std::make_shared<hetseq::DistributedReducer>(*model, group, DdpOptions{}),
                                        std::make_shared<hetseq::GroupChannel>(group, torch::kCPU, fast));
      for (const auto& update : batches) {
        sums[rank].push_back(controller->train_update(update[rank]).sums);
        params[rank].push_back(values_of(*model));
      }
    });
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      CHECK(tasks[r].calls == (r == 2 ? 2 : r == 1 ? 3 : 4));  // only the non-empty micro-batches
      for (size_t u = 0; u < batches.size(); ++u) {
        CAPTURE(u);
        CHECK(max_rel_diff(params[r][u], expected[u]) < 1e-12);
        CHECK(hetseq::test::all_equal(params[r][u], params[0][u]));  // bitwise the same on every rank
        REQUIRE(sums[r][u].size() == 3);  // loss, nsentences, sample_size: the names of the non-empty ranks
        CHECK(sums[r][u].at("sample_size") == expected_sums[u].at("sample_size"));
        CHECK(sums[r][u].at("nsentences") == expected_sums[u].at("sample_size"));
        CHECK(sums[r][u].at("loss") == Approx(expected_sums[u].at("loss")).epsilon(1e-12));
      }
    }
  }
}

namespace {

// Four heads on one input: `a` is used on every rank in every update, `b` on rank 1 only, `once` on
// every rank in the first update only, `never` never.
struct Heads : Net {
  Heads(int rank, uint64_t seed) : rank(rank) {
    torch::manual_seed(seed);
    for (const char* name : {"a", "b", "once", "never"}) heads.emplace(name, register_module(name, torch::nn::Linear(4, 3)));
    to(torch::kFloat64);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor y = heads.at("a")->forward(x);
    if (rank == 1) y = y + heads.at("b")->forward(x);
    if (updates++ == 0) y = y + heads.at("once")->forward(x);
    return y;
  }
  int rank;
  int64_t updates = 0;  // forward passes so far: one per update here
  std::map<std::string, torch::nn::Linear> heads;
};

}  // namespace

TEST_CASE("With find_unused_parameters, through the Controller and Adam with weight decay, a parameter no rank "
          "uses keeps its value and gets no optimizer state",
          "[ddp][controller]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  constexpr int kUpdates = 4;
  std::vector<std::map<std::string, torch::Tensor>> initial(kWorld), after_first(kWorld), last(kWorld);  // [rank]
  std::vector<std::map<std::string, bool>> grad_defined(kWorld);              // [rank] after the last update
  std::vector<std::map<std::string, int64_t>> steps(kWorld);                  // [rank] Adam's count per parameter
  std::vector<std::set<std::string>> state_keys(kWorld);                      // [rank]
  std::vector<std::vector<std::string>> names(kWorld);                        // [rank][param]
  std::vector<std::shared_ptr<Heads>> models;  // built here: initialisation draws from the global generator
  for (int r = 0; r < kWorld; ++r) models.push_back(std::make_shared<Heads>(r, r == 0 ? 11 : 110 + r));
  std::vector<std::vector<Batch>> batches(kWorld);  // [rank][update]
  for (int r = 0; r < kWorld; ++r) {
    for (int u = 0; u < kUpdates; ++u) batches[r].push_back(make_batch(1000 + 10 * u + r, 2 + r));
  }
  run_ranks(kWorld, [&](int rank, const Group& group) {
    const auto& model = models[rank];
    RegressionTask task;
    DdpOptions options;
    options.find_unused_parameters = true;
    options.bucket_cap_mb = 1e-6;  // one bucket per parameter
    hetseq::optim::AdamOptions adam;
    adam.lr = 0.01;
    adam.weight_decay = 0.1;
    auto controller =
        make_controller(task, model, std::make_shared<hetseq::DistributedReducer>(*model, group, options),
                        std::make_shared<hetseq::GroupChannel>(group, torch::kCPU, false),
                        std::make_unique<hetseq::optim::Adam>(model->parameters(), adam));
    auto snapshot = [&] {
      std::map<std::string, torch::Tensor> out;
      for (const auto& item : model->named_parameters()) out[item.key()] = item.value().detach().clone();
      return out;
    };
    initial[rank] = snapshot();
    for (int u = 0; u < kUpdates; ++u) {
      controller->train_update({batches[rank][u]});
      if (u == 0) after_first[rank] = snapshot();
    }
    last[rank] = snapshot();
    const auto state = controller->optimizer().state();
    for (const auto& [key, value] : state) state_keys[rank].insert(key);
    size_t i = 0;
    for (const auto& item : model->named_parameters()) {
      names[rank].push_back(item.key());
      grad_defined[rank][item.key()] = item.value().grad().defined();
      const auto step = state.find("param." + std::to_string(i) + ".step");
      steps[rank][item.key()] = step == state.end() ? 0 : step->second.item<int64_t>();
      ++i;
    }
  });

  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    for (size_t i = 0; i < names[r].size(); ++i) {
      const std::string& name = names[r][i];
      const std::string head = name.substr(0, name.find('.'));
      CAPTURE(name);
      CHECK(torch::equal(last[r].at(name), last[0].at(name)));  // the same model on every rank
      if (head == "never") {
        // Bit for bit rank 0's initial value: no weight decay, no step, no buffers.
        CHECK(torch::equal(last[r].at(name), initial[0].at(name)));
        CHECK(steps[r].at(name) == 0);
        CHECK(state_keys[r].count("param." + std::to_string(i) + ".exp_avg") == 0);
        CHECK_FALSE(grad_defined[r].at(name));
      } else if (head == "once") {
        // Used by every rank in the first update, then by none: unchanged after the first step,
        // although its gradient was a zeroed bucket view until the reducer dropped it.
        CHECK_FALSE(torch::equal(after_first[r].at(name), initial[0].at(name)));
        CHECK(torch::equal(last[r].at(name), after_first[r].at(name)));
        CHECK(steps[r].at(name) == 1);
        CHECK_FALSE(grad_defined[r].at(name));
      } else {  // a: every rank; b: rank 1 only, with zeros from the others
        CHECK_FALSE(torch::equal(last[r].at(name), after_first[r].at(name)));
        CHECK(steps[r].at(name) == kUpdates);
        CHECK(grad_defined[r].at(name));
      }
    }
  }
}

namespace {

// A linear map and a buffer `seen` that every forward pass increases by `increment` (its rank + 1),
// recording the value it found: a running statistic that differs across ranks.
struct Counting : Net {
  explicit Counting(int rank) : increment(rank + 1) {
    torch::manual_seed(5);
    linear = register_module("linear", torch::nn::Linear(4, 3));
    linear->to(torch::kFloat64);
    seen = register_buffer("seen", torch::full({1}, 100.0 * rank, torch::kFloat64));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    found.push_back(seen.item<double>());
    seen.add_(increment);
    return linear->forward(x);
  }
  double increment;
  std::vector<double> found;  // [forward pass] the buffer's value at its start
  torch::nn::Linear linear{nullptr};
  torch::Tensor seen;
};

}  // namespace

TEST_CASE("Buffers are rank 0's at the start of each update with broadcast_buffers, each rank's own without",
          "[ddp][controller]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  constexpr int kUpdates = 3;
  for (bool broadcast : {true, false}) {
    CAPTURE(broadcast);
    std::vector<std::vector<double>> found(kWorld);  // [rank][forward pass]
    std::vector<std::shared_ptr<Counting>> models;
    for (int r = 0; r < kWorld; ++r) models.push_back(std::make_shared<Counting>(r));
    std::vector<Batch> batches;  // [micro-batch], the same on every rank and in every update
    for (int64_t n : {2, 3}) batches.push_back(make_batch(20 + n, n));
    run_ranks(kWorld, [&](int rank, const Group& group) {
      const auto& model = models[rank];
      RegressionTask task;
      DdpOptions options;
      options.broadcast_buffers = broadcast;
      auto controller =
          make_controller(task, model, std::make_shared<hetseq::DistributedReducer>(*model, group, options),
                          std::make_shared<hetseq::GroupChannel>(group, torch::kCPU, false));
      for (int u = 0; u < kUpdates; ++u) {
        controller->train_update(batches);  // two forward passes per update
      }
      found[rank] = model->found;
    });
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      // The constructor made every rank start from rank 0's buffer (0). With the broadcast, update u
      // starts from rank 0's value, 2u (rank 0 adds 1 per forward), and the second forward sees this
      // rank's own increment on top; without it each rank counts on its own.
      std::vector<double> expected;
      for (int u = 0; u < kUpdates; ++u) {
        const double start = broadcast ? 2.0 * u : 2.0 * u * (r + 1);
        expected.push_back(start);
        expected.push_back(start + r + 1);
      }
      CHECK(found[r] == expected);
    }
  }
}

TEST_CASE("A task whose train_step never calls its Backward gets an error saying so, not a hang or a crash",
          "[controller]") {
  // The Controller starts the update's statistics on the channel from inside the Backward it hands the
  // task: a train_step that skips it leaves nothing to reduce, which must be a clear error.
  class NoBackwardTask final : public RegressionTask {
   public:
    hetseq::StepOutput train_step(torch::nn::Module& model, const Batch& batch, const Backward&) override {
      return compute_loss(model, batch);  // no backward
    }
  } task;
  auto model = std::make_shared<Mlp>(7);
  auto controller = make_controller(task, model, std::make_shared<hetseq::LocalReducer>(), nullptr);
  try {
    controller->train_update({make_batch(1, 4)});
    FAIL("train_update returned");
  } catch (const hetseq::InputError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("rank 0 of 1: the task's train_step returned without calling the "
                                           "Backward it was given for the update's last micro-batch"));
  }
}
