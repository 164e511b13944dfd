// Communication of an update: the comm hooks (--ddp-comm-hook fp16 and bf16, Note [Comm hooks]) and
// the statistics that travel during backward (Note [Stat sync]), with ranks as threads sharing a
// store and real Gloo groups (level 1 of STYLE's test levels).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/reduce/comm_hook.h"
#include "support/counting_backend.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/channel/group_channel.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/optim/sgd.h"
#include "hetseq/train/controller.h"
#include "support/error_message.h"
#include "support/rank_threads.h"

using Catch::Contains;
using hetseq::CommHook;
using hetseq::DdpOptions;
using hetseq::DistributedReducer;
using hetseq::GroupChannel;
using hetseq::LogSums;
using hetseq::test::Group;
using hetseq::test::is_a;
using hetseq::test::message_of;
using hetseq::test::OneIntraOpThread;
using hetseq::test::run_ranks;
using hetseq::test::run_ranks_collect;

namespace {

constexpr int kWorld = 2;

// The collectives `group` was asked for during `run`, counted by the group's backend (from outside the
// reducer and the statistics, which keep no count of their own that this relies on).
template <class F>
std::vector<hetseq::CollectiveRecord> collectives_during(const Group& group, F&& run) {
  hetseq::CountingBackend* counter = hetseq::counting_backend(group);
  if (counter == nullptr) throw std::logic_error("the rank threads' group does not count its collectives");
  const size_t before = counter->count();
  run();
  std::vector<hetseq::CollectiveRecord> all = counter->records();
  return {all.begin() + static_cast<std::ptrdiff_t>(before), all.end()};
}

// How many collectives an update asked for after its last gradient bucket (the last float32 allreduce):
// the statistics round trips that backward did not hide. The statistics travel as float64 (fast) or as
// an allgather, never as a float32 allreduce.
int64_t after_last_bucket(const std::vector<hetseq::CollectiveRecord>& update) {
  int64_t after = 0;
  for (const auto& r : update) {
    if (r.op == "allreduce" && r.dtype == c10::ScalarType::Float) {
      after = 0;
    } else {
      ++after;
    }
  }
  return after;
}

// Rank r's gradient for a Linear(8, 4): weight [4, 8] and bias [4], random, times `magnitude`.
struct RankGradients {
  torch::Tensor weight, bias;
};
RankGradients gradients_of(int rank, double magnitude) {
  torch::manual_seed(1000 + rank);
  return {torch::randn({4, 8}) * magnitude, torch::randn({4}) * magnitude};
}

// One reduced backward on every rank with the given hook: rank r's loss has exactly gradients_of(r)
// and its statistics report sample_size sizes[r]. Returns rank 0's reduced [weight, bias] gradients
// (the test checks the ranks agree) and the wire bytes of the update.
struct Reduced {
  std::vector<torch::Tensor> grads;  // [rank] weight and bias flattened into one vector
  int64_t bytes = 0;
};
Reduced reduce_once(CommHook hook, double magnitude, const std::vector<double>& sizes) {
  std::vector<torch::nn::Linear> models;
  for (int r = 0; r < kWorld; ++r) models.emplace_back(torch::nn::Linear(8, 4));
  Reduced out;
  out.grads.resize(kWorld);
  std::vector<int64_t> bytes(kWorld);
  std::vector<RankGradients> gradients;  // drawn here: the rank threads would race on the global generator
  for (int r = 0; r < kWorld; ++r) gradients.push_back(gradients_of(r, magnitude));
  run_ranks(kWorld, [&](int rank, const Group& group) {
    DdpOptions options;
    options.comm_hook = hook;
    DistributedReducer reducer(*models[rank], group, options);
    const RankGradients& g = gradients[rank];
    const torch::Tensor loss = (models[rank]->weight * g.weight).sum() + (models[rank]->bias * g.bias).sum();
    GroupChannel channel(group, torch::kCPU, false);
    channel.start_update({{"sample_size", sizes[rank]}}, false);  // the comm hooks divide by the global count
    reducer.before_backward(0, 1, loss, [&channel] { return channel.update_sample_size(); });
    loss.backward();
    reducer.finish_update();
    channel.finish_update();
    out.grads[rank] = torch::cat({models[rank]->weight.grad().flatten(), models[rank]->bias.grad()}).clone();
    bytes[rank] = reducer.last_timing().bytes;
  });
  out.bytes = bytes[0];
  return out;
}

torch::Tensor flat(const RankGradients& g) { return torch::cat({g.weight.flatten(), g.bias}); }

}  // namespace

TEST_CASE("fp16 and bf16 comm hooks: the sum of the rank's gradients cast to the format, half the bytes",
          "[ddp][comm-hook]") {
  OneIntraOpThread one_thread;
  const std::vector<double> sizes{3, 5};
  const double S = 8;  // the update's global sample count, by which the hook divides before casting
  const torch::Tensor exact = flat(gradients_of(0, 1)) + flat(gradients_of(1, 1));

  const Reduced none = reduce_once(CommHook::kNone, 1, sizes);
  CHECK(torch::equal(none.grads[0], exact));
  CHECK(none.bytes == 36 * 4);

  for (CommHook hook : {CommHook::kFp16, CommHook::kBf16}) {
    CAPTURE(hetseq::to_string(hook));
    const auto type = hetseq::wire_type(hook);
    const Reduced got = reduce_once(hook, 1, sizes);
    CHECK(got.bytes == 36 * 2);
    CHECK(torch::equal(got.grads[0], got.grads[1]));  // every rank has the same sum
    // The reference: each rank's gradient over S in the format, added once in float and rounded to the
    // format (two ranks: one addition per element), times S.
    const torch::Tensor a = (flat(gradients_of(0, 1)) / S).to(type).to(torch::kFloat32);
    const torch::Tensor b = (flat(gradients_of(1, 1)) / S).to(type).to(torch::kFloat32);
    const torch::Tensor reference = (a + b).to(type).to(torch::kFloat32) * S;
    const double unit = hook == CommHook::kFp16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);  // format's epsilon
    CHECK(((got.grads[0] - reference).abs() <= 1e-6 * reference.abs()).all().item<bool>());
    // Within the format's rounding (of each term and of the sum) of the exact sum, and not the exact sum: the cast happened.
    const torch::Tensor magnitude = flat(gradients_of(0, 1)).abs() + flat(gradients_of(1, 1)).abs();
    CHECK(((got.grads[0] - exact).abs() <= 2 * unit * magnitude).all().item<bool>());
    CHECK_FALSE(torch::equal(got.grads[0], exact));
  }

  SECTION("fp16: terms are divided by the global sample count, so large summed gradients stay in range") {
    // Each rank's summed gradient reaches 4e5 (float16's largest is 65504); over S = 8 it is 5e4.
    const Reduced big = reduce_once(CommHook::kFp16, 1e5, sizes);
    const torch::Tensor big_exact = flat(gradients_of(0, 1e5)) + flat(gradients_of(1, 1e5));
    REQUIRE(big_exact.abs().max().item<double>() > 65504);
    CHECK(torch::isfinite(big.grads[0]).all().item<bool>());
    const torch::Tensor magnitude = flat(gradients_of(0, 1e5)).abs() + flat(gradients_of(1, 1e5)).abs();
    CHECK(((big.grads[0] - big_exact).abs() <= 2 * std::ldexp(1.0, -10) * magnitude).all().item<bool>());
  }
}

TEST_CASE("Comm hook names parse and a wrong one is an error naming the flag", "[ddp][comm-hook]") {
  CHECK(hetseq::parse_comm_hook("none") == CommHook::kNone);
  CHECK(hetseq::parse_comm_hook("fp16") == CommHook::kFp16);
  CHECK(hetseq::parse_comm_hook("bf16") == CommHook::kBf16);
  CHECK(hetseq::parse_comm_hook("powersgd") == CommHook::kPowerSgd);
  const std::string message = hetseq::test::error_of<hetseq::UsageError>([] { hetseq::parse_comm_hook("fp8"); });
  CHECK_THAT(message, Contains("--ddp-comm-hook") && Contains("'fp8'") && Contains("none, fp16, bf16, powersgd"));
}

namespace {

/// Squared error summed over the batch of a Linear(4, 3) in float32; its sample size is the number of
/// samples. `late_log`: the task adds a statistic after calling backward, which the Controller refuses.
class HookRegressionTask final : public hetseq::Task {
 public:
  explicit HookRegressionTask(bool late_log = false) : late_log_(late_log) {}
  std::shared_ptr<torch::nn::Module> build_model() override { throw hetseq::InternalError("not used"); }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string&) override {
    throw hetseq::InternalError("not used");
  }
  hetseq::StepOutput compute_loss(torch::nn::Module& model, const hetseq::Batch& batch) override {
    const torch::Tensor error = dynamic_cast<torch::nn::LinearImpl&>(model).forward(batch.at("x")) - batch.at("y");
    hetseq::StepOutput out;
    out.loss = error.pow(2).sum();
    out.sample_size = static_cast<double>(batch.num_samples);
    out.log = {{"loss", out.loss.item<double>()}, {"nsentences", out.sample_size}};
    return out;
  }
  hetseq::StepOutput train_step(torch::nn::Module& model, const hetseq::Batch& batch,
                                const Backward& backward) override {
    hetseq::StepOutput out = compute_loss(model, batch);
    backward(out);
    if (late_log_) out.log["late"] = 1;
    return out;
  }

 private:
  bool late_log_;
};

// Drawn from a generator of its own: rank threads call it at the same time.
hetseq::Batch make_batch(uint64_t seed, int64_t size, double target_scale = 1) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  hetseq::Batch b;
  b.fields = {{"x", torch::randn({size, 4}, gen)}, {"y", torch::randn({size, 3}, gen) * target_scale}};
  b.num_samples = size;
  return b;
}

std::unique_ptr<hetseq::Controller> make_controller(hetseq::Task& task, const std::shared_ptr<torch::nn::LinearImpl>& model,
                                                    std::shared_ptr<hetseq::GradientReducer> reducer,
                                                    std::shared_ptr<hetseq::CollectiveChannel> channel,
                                                    std::optional<hetseq::LossScalerOptions> scaling = std::nullopt) {
  hetseq::optim::SgdOptions sgd;
  sgd.lr = 0.01;
  auto optimizer = std::make_unique<hetseq::optim::Sgd>(model->parameters(), sgd);
  hetseq::optim::FixedOptions fixed;
  fixed.lrs = {optimizer->lr()};
  auto scheduler = std::make_unique<hetseq::optim::Fixed>(*optimizer, fixed);
  hetseq::ControllerOptions options;
  options.clip_norm = 0;
  options.loss_scaling = scaling;
  return std::make_unique<hetseq::Controller>(task, model, std::move(optimizer), std::move(scheduler), std::move(reducer),
                                             options, std::move(channel));
}

std::vector<std::shared_ptr<torch::nn::LinearImpl>> make_models() {
  std::vector<std::shared_ptr<torch::nn::LinearImpl>> models;
  for (int r = 0; r < kWorld; ++r) {
    torch::manual_seed(5);
    models.push_back(std::make_shared<torch::nn::LinearImpl>(4, 3));
  }
  return models;
}

}  // namespace

TEST_CASE("Statistics travel during backward: exactly the sums of a separate sync, no round trip after backward",
          "[ddp][comm-hook][stat-sync]") {
  OneIntraOpThread one_thread;
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    // [rank][update] updates of 2 micro-batches, of sizes 3 + rank and 2.
    std::vector<std::vector<LogSums>> fused(kWorld), separate(kWorld);
    std::vector<std::vector<std::vector<LogSums>>> fused_per_rank(kWorld), separate_per_rank(kWorld);
    std::vector<std::vector<int64_t>> late_rounds(kWorld);
    auto models = make_models();
    std::vector<HookRegressionTask> tasks(kWorld);
    run_ranks(kWorld, [&](int rank, const Group& group) {
      auto reducer = std::make_shared<DistributedReducer>(*models[rank], group, hetseq::test::ddp_over_group());
      auto channel = std::make_shared<GroupChannel>(group, torch::kCPU, fast);
      auto controller = make_controller(tasks[rank], models[rank], reducer, channel);
      for (int u = 0; u < 3; ++u) {
        const std::vector<hetseq::Batch> batches{make_batch(10 * u + rank, 3 + rank), make_batch(10 * u + 5, 2)};
        // The same statistics summed after the fact, by the separate sync (validation's path).
        LogSums local;
        {
          torch::NoGradGuard no_grad;
          for (const auto& b : batches) {
            const hetseq::StepOutput out = tasks[rank].compute_loss(*models[rank], b);
            for (const auto& [name, value] : out.log) local[name] += value;
            local["sample_size"] += out.sample_size;
          }
        }
        separate[rank].push_back(channel->sum(local));
        separate_per_rank[rank].push_back(channel->last_per_rank());
        const auto asked = collectives_during(group, [&] { fused[rank].push_back(controller->train_update(batches).sums); });
        fused_per_rank[rank].push_back(channel->last_per_rank());
        late_rounds[rank].push_back(after_last_bucket(asked));
      }
    });
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      for (int u = 0; u < 3; ++u) {
        CAPTURE(u);
        CHECK(fused[r][u].at("sample_size") == 3 + 4 + 2 + 2);
        CHECK(fused[r][u] == separate[r][u]);  // bitwise
        CHECK(fused_per_rank[r][u] == separate_per_rank[r][u]);
        CHECK(fused_per_rank[r][u].size() == (fast ? 0u : 2u));
      }
      // The first update learns the names (one more round, fast, or the serialised gather); the syncs of
      // other names in between (validation's path) do not cost the updates a round.
      CHECK(late_rounds[r] == std::vector<int64_t>{fast ? 1 : 2, 0, 0});
    }
  }
}

TEST_CASE("In the steady state an update waits for no statistics collective after backward",
          "[ddp][comm-hook][stat-sync]") {
  OneIntraOpThread one_thread;
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    std::vector<std::vector<int64_t>> late_rounds(kWorld), totals(kWorld), rebuilds(kWorld);  // [rank][update]
    std::vector<std::vector<double>> losses(kWorld);
    auto models = make_models();
    std::vector<HookRegressionTask> tasks(kWorld);
    run_ranks(kWorld, [&](int rank, const Group& group) {
      auto reducer = std::make_shared<DistributedReducer>(*models[rank], group, hetseq::test::ddp_over_group());
      auto channel = std::make_shared<GroupChannel>(group, torch::kCPU, fast);
      auto controller = make_controller(tasks[rank], models[rank], reducer, channel);
      for (int u = 0; u < 5; ++u) {
        hetseq::UpdateResult result;
        const auto asked = collectives_during(group, [&] { result = controller->train_update({make_batch(10 * u + rank, 4)}); });
        late_rounds[rank].push_back(after_last_bucket(asked));
        const auto broadcasts = std::count_if(asked.begin(), asked.end(), [](const auto& c) { return c.op == "broadcast"; });
        totals[rank].push_back(static_cast<int64_t>(asked.size()) - reducer->last_timing().buckets - broadcasts);
        rebuilds[rank].push_back(broadcasts);
        losses[rank].push_back(result.sums.at("loss"));
      }
    });
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      CHECK(late_rounds[r] == std::vector<int64_t>{fast ? 1 : 2, 0, 0, 0, 0});
      // Beyond its gradient buckets, an update asks for the one statistics collective started before
      // backward, and the first update the rounds that learn the names. The second update also
      // carries c10d's one bucket rebuild (rank 0's order of the buckets, broadcast in two parts).
      CHECK(totals[r] == std::vector<int64_t>{fast ? 2 : 3, 1, 1, 1, 1});
      CHECK(rebuilds[r] == std::vector<int64_t>{0, 2, 0, 0, 0});
      if (r > 0) CHECK(losses[r] == losses[0]);
    }
  }

  SECTION("the gradient reducer alone asks for its buckets and nothing else") {
    std::vector<int64_t> others(kWorld, -1);
    std::vector<torch::nn::Linear> models;
    for (int r = 0; r < kWorld; ++r) models.emplace_back(torch::nn::Linear(2, 2));
    run_ranks(kWorld, [&](int rank, const Group& group) {
      DistributedReducer reducer(*models[rank], group, hetseq::test::ddp_over_group());
      for (int u = 0; u < 3; ++u) {
        const auto asked = collectives_during(group, [&] {
          const torch::Tensor loss = models[rank]->forward(torch::ones({1, 2})).sum();
          reducer.before_backward(0, 1, loss);
          loss.backward();
          reducer.finish_update();
        });
        const auto broadcasts = std::count_if(asked.begin(), asked.end(), [](const auto& c) { return c.op == "broadcast"; });
        if (u == 2) others[rank] = static_cast<int64_t>(asked.size()) - reducer.last_timing().buckets - broadcasts;
      }
    });
    CHECK(others == std::vector<int64_t>{0, 0});
  }
}

TEST_CASE("A task whose statistics change after it called backward gets an error naming both",
          "[ddp][comm-hook][stat-sync]") {
  OneIntraOpThread one_thread;
  auto models = make_models();
  std::vector<HookRegressionTask> tasks{HookRegressionTask(true), HookRegressionTask(true)};
  auto errors = run_ranks_collect(kWorld, [&](int rank, const Group& group) {
    auto reducer = std::make_shared<DistributedReducer>(*models[rank], group, DdpOptions{});
    auto controller =
        make_controller(tasks[rank], models[rank], reducer, std::make_shared<GroupChannel>(group, torch::kCPU, false));
    controller->train_update({make_batch(rank, 4)});
  });
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    REQUIRE(errors[r]);
    CHECK(is_a<hetseq::InputError>(errors[r]));
    CHECK_THAT(message_of(errors[r]), Contains("rank " + std::to_string(r) + " of 2: ") &&
                                          Contains("changed after it called backward") && Contains("late=1") &&
                                          Contains("StepOutput's log and sample_size complete"));
  }
}

TEST_CASE("fp16 comm hook with loss scaling: an update that overflows float16 on the wire is skipped on every "
          "rank and without loss scaling it is an error",
          "[ddp][comm-hook][fp16]") {
  OneIntraOpThread one_thread;
  hetseq::LossScalerOptions scaling;
  scaling.init_scale = std::ldexp(1.0, 40);  // float32 holds the scaled gradients, float16 does not
  scaling.scale_window = 1000;
  for (CommHook hook : {CommHook::kNone, CommHook::kFp16}) {
    CAPTURE(hetseq::to_string(hook));
    std::vector<std::vector<bool>> skipped(kWorld);
    std::vector<double> scale_after(kWorld);
    auto models = make_models();
    std::vector<HookRegressionTask> tasks(kWorld);
    run_ranks(kWorld, [&](int rank, const Group& group) {
      DdpOptions options;
      options.comm_hook = hook;
      auto reducer = std::make_shared<DistributedReducer>(*models[rank], group, options);
      auto controller = make_controller(tasks[rank], models[rank], reducer,
                                        std::make_shared<GroupChannel>(group, torch::kCPU, false), scaling);
      for (int u = 0; u < 2; ++u) skipped[rank].push_back(controller->train_update({make_batch(u + rank, 4)}).skipped);
      scale_after[rank] = controller->train_update({make_batch(7 + rank, 4)}).loss_scale;
    });
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      if (hook == CommHook::kNone) {
        CHECK(skipped[r] == std::vector<bool>{false, false});
        CHECK(scale_after[r] == scaling.init_scale);
      } else {
        CHECK(skipped[r] == std::vector<bool>{true, true});
        CHECK(scale_after[r] == scaling.init_scale / 4);  // halved at each skipped update
      }
    }
  }

  SECTION("without loss scaling, float16's overflow on the wire stops the run with what to do") {
    auto models = make_models();
    std::vector<HookRegressionTask> tasks(kWorld);
    auto errors = run_ranks_collect(kWorld, [&](int rank, const Group& group) {
      DdpOptions options;
      options.comm_hook = CommHook::kFp16;
      auto reducer = std::make_shared<DistributedReducer>(*models[rank], group, options);
      auto controller =
          make_controller(tasks[rank], models[rank], reducer, std::make_shared<GroupChannel>(group, torch::kCPU, false));
      controller->train_update({make_batch(rank, 4, 1e7)});  // mean gradients of about 1e7
      controller->read_late_update();  // the norm is read after the update (Note [Reading an update late])
    });
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      REQUIRE(errors[r]);
      CHECK(is_a<hetseq::InputError>(errors[r]));
      CHECK_THAT(message_of(errors[r]), Contains("update 1: the gradient norm is ") && (Contains("inf") || Contains("nan")) &&
                                            Contains("--ddp-comm-hook bf16") && Contains("--fp16"));
    }
  }
}
