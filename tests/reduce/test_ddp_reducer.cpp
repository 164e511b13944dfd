// DistributedReducer with ranks as threads in one process, sharing a HashStore, each with its own Gloo
// process group (level 1 of STYLE's test levels; see support/rank_threads.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "support/counting_backend.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/channel/group_channel.h"
#include "support/tensor_lists.h"
#include "support/rank_threads.h"

using hetseq::DdpOptions;
using hetseq::DistributedReducer;
using hetseq::GroupChannel;
using hetseq::LogSums;
using hetseq::SharedMemoryReduceMode;

namespace {

using hetseq::test::Group;
using hetseq::test::is_a;
using hetseq::test::message_of;
using hetseq::test::OneIntraOpThread;
using hetseq::test::run_ranks;
using hetseq::test::run_ranks_collect;

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.defined() ? t.detach().clone() : torch::Tensor());
  return out;
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.grad());
  return copies(out);
}

void clear_grads(torch::nn::Module& model) {
  for (auto& p : model.parameters()) p.mutable_grad().reset();
}

// Largest |a - b| / (1 + |b|) over corresponding tensors; infinity when one is undefined.
double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].defined() || !b[i].defined()) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, ((a[i] - b[i]).abs() / (1 + b[i].abs())).max().item<double>());
  }
  return worst;
}

torch::nn::Sequential make_mlp(uint64_t seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential mlp(torch::nn::Linear(5, 16), torch::nn::Tanh(), torch::nn::Linear(16, 8), torch::nn::Tanh(),
                            torch::nn::Linear(8, 3));
  mlp->to(torch::kFloat64);
  return mlp;
}

struct ReducerBatch {
  torch::Tensor x, y;
};

ReducerBatch reducer_batch(uint64_t seed, int64_t size) {
  torch::manual_seed(seed);
  auto options = torch::TensorOptions().dtype(torch::kFloat64);
  return {torch::randn({size, 5}, options), torch::randn({size, 3}, options)};
}

ReducerBatch concat(const std::vector<ReducerBatch>& batches) {
  std::vector<torch::Tensor> xs, ys;
  for (const auto& b : batches) {
    xs.push_back(b.x);
    ys.push_back(b.y);
  }
  return {torch::cat(xs), torch::cat(ys)};
}

torch::Tensor summed_loss(torch::nn::Sequential& mlp, const ReducerBatch& b) { return (mlp->forward(b.x) - b.y).pow(2).sum(); }

// Gradients of one process on the concatenation of `batches`, from the parameters of make_mlp(seed).
std::vector<torch::Tensor> oracle_grads(uint64_t seed, const std::vector<ReducerBatch>& batches) {
  auto mlp = make_mlp(seed);
  summed_loss(mlp, concat(batches)).backward();
  return grads_of(*mlp);
}

}  // namespace

TEST_CASE("Rank-valued gradients and sums add up to their closed form over 3 ranks", "[ddp]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  // Different random parameters on each rank: the reducer must start them all from rank 0's.
  std::vector<torch::nn::Linear> models;
  for (int r = 0; r < kWorld; ++r) {
    torch::manual_seed(100 + r);
    models.emplace_back(torch::nn::Linear(3, 2));
  }
  const auto rank0_initial = copies(models[0]->parameters());
  REQUIRE_FALSE(hetseq::test::all_equal(copies(models[1]->parameters()), rank0_initial));
  const torch::Tensor coeffs = torch::arange(1, 7, torch::kFloat32).reshape({2, 3});  // weight's coefficients

  std::vector<std::vector<torch::Tensor>> after_broadcast(kWorld);  // [rank][param]
  std::vector<std::vector<std::vector<torch::Tensor>>> grads(kWorld);  // [rank][update][param]
  std::vector<std::vector<LogSums>> sums(kWorld);                   // [rank][update]
  std::vector<std::vector<LogSums>> per_rank(kWorld);               // [rank][rank seen]
  std::vector<int64_t> buckets(kWorld);

  run_ranks(kWorld, [&](int rank, const Group& group) {
    auto& model = models[rank];
    DdpOptions options;
    options.bucket_cap_mb = 1e-6;  // one bucket per parameter
    DistributedReducer reducer(*model, group, options);
    GroupChannel channel(group, torch::kCPU, false);  // the statistics, beside the gradients
    after_broadcast[rank] = copies(model->parameters());
    buckets[rank] = static_cast<int64_t>(reducer.bucket_sizes().size());
    const double c = rank + 1;
    for (int update = 0; update < 2; ++update) {  // the second update runs on rebuilt buckets
      clear_grads(*model);
      torch::Tensor loss = c * (model->weight * coeffs).sum() + c * c * model->bias.sum();
      channel.start_update({{"loss", rank + 0.5}, {"sample_size", c}, {"ntokens", 10 * c}}, false);
      reducer.before_backward(0, 1, loss, [&channel] { return channel.update_sample_size(); });
      loss.backward();
      reducer.finish_update();
      sums[rank].push_back(channel.finish_update().sums);
      grads[rank].push_back(grads_of(*model));
    }
    per_rank[rank] = channel.last_per_rank();
  });

  const torch::Tensor expected_weight = 6 * coeffs;  // sum over ranks of (r + 1) * coeffs
  const torch::Tensor expected_bias = torch::full({2}, 14.0f);  // 1 + 4 + 9
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(hetseq::test::all_equal(after_broadcast[r], rank0_initial));
    CHECK(buckets[r] == 2);
    for (int update = 0; update < 2; ++update) {
      CAPTURE(update);
      CHECK(torch::equal(grads[r][update][0], expected_weight));
      CHECK(torch::equal(grads[r][update][1], expected_bias));
      CHECK(sums[r][update] == LogSums{{"loss", 4.5}, {"ntokens", 60}, {"sample_size", 6}});
    }
    REQUIRE(per_rank[r].size() == 3);
    for (int q = 0; q < kWorld; ++q) CHECK(per_rank[r][q].at("sample_size") == q + 1);
  }
}

TEST_CASE("Bucket caps from below one parameter to above the model give the oracle's gradients", "[ddp]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  const std::vector<int64_t> batch_sizes{1, 4, 7};  // unequal per-rank batches
  std::vector<ReducerBatch> batches;
  for (int r = 0; r < kWorld; ++r) batches.push_back(reducer_batch(500 + r, batch_sizes[r]));
  const auto oracle = oracle_grads(7, batches);

  // Both ways a bucket can go: through shared memory (the ranks are threads of one machine) and the process group.
  const auto path = GENERATE(SharedMemoryReduceMode::kOn, SharedMemoryReduceMode::kOff);
  CAPTURE(path == SharedMemoryReduceMode::kOn ? "shared memory" : "process group");
  for (double cap_mb : {1e-6, 0.0005, 0.002, 25.0, 100.0}) {
    CAPTURE(cap_mb);
    std::vector<torch::nn::Sequential> models;
    for (int r = 0; r < kWorld; ++r) models.push_back(make_mlp(r == 0 ? 7 : 70 + r));
    std::vector<std::vector<std::vector<torch::Tensor>>> grads(kWorld);  // [rank][update][param]
    std::vector<std::vector<int64_t>> bucket_counts(kWorld);           // [rank][update]
    run_ranks(kWorld, [&](int rank, const Group& group) {
      auto& mlp = models[rank];
      DdpOptions options;
      options.bucket_cap_mb = cap_mb;
      options.shared_memory = path;
      DistributedReducer reducer(*mlp, group, options);
      for (int update = 0; update < 3; ++update) {
        clear_grads(*mlp);
        torch::Tensor loss = summed_loss(mlp, batches[rank]);
        reducer.before_backward(0, 1, loss);
        loss.backward();
        reducer.finish_update();
        grads[rank].push_back(grads_of(*mlp));
        bucket_counts[rank].push_back(reducer.last_timing().buckets);
      }
    });
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      for (int update = 0; update < 3; ++update) {
        CAPTURE(update);
        CHECK(max_rel_diff(grads[r][update], oracle) < 1e-12);
        CHECK(hetseq::test::all_equal(grads[r][update], grads[0][update]));  // bitwise the same on every rank
        if (cap_mb == 1e-6) CHECK(bucket_counts[r][update] == 6);
        if (cap_mb == 100.0) CHECK(bucket_counts[r][update] == 1);
      }
    }
  }
}

TEST_CASE("Gradient accumulation reduces once, at the last micro-batch, the sum of all micro-batches", "[ddp]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  constexpr int kCount = 3;
  std::vector<std::vector<ReducerBatch>> micro(kWorld);  // [rank][micro-batch]
  std::vector<ReducerBatch> all;
  for (int r = 0; r < kWorld; ++r) {
    for (int k = 0; k < kCount; ++k) {
      micro[r].push_back(reducer_batch(900 + 10 * r + k, 1 + r + k));
      all.push_back(micro[r].back());
    }
  }
  const auto oracle = oracle_grads(7, all);
  std::vector<std::vector<torch::Tensor>> local_oracle(kWorld);  // [rank] first two micro-batches, alone
  for (int r = 0; r < kWorld; ++r) local_oracle[r] = oracle_grads(7, {micro[r][0], micro[r][1]});

  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(make_mlp(r == 0 ? 7 : 80 + r));
  const auto path = GENERATE(SharedMemoryReduceMode::kOn, SharedMemoryReduceMode::kOff);
  CAPTURE(path == SharedMemoryReduceMode::kOn ? "shared memory" : "process group");
  std::vector<std::vector<torch::Tensor>> before_last(kWorld), reduced(kWorld);
  std::vector<int64_t> launched(kWorld);
  run_ranks(kWorld, [&](int rank, const Group& group) {
    auto& mlp = models[rank];
    DdpOptions options;
    options.bucket_cap_mb = 0.001;
    options.shared_memory = path;
    DistributedReducer reducer(*mlp, group, options);
    clear_grads(*mlp);
    for (int k = 0; k < kCount; ++k) {
      if (k == kCount - 1) before_last[rank] = grads_of(*mlp);
      torch::Tensor loss = summed_loss(mlp, micro[rank][k]);
      reducer.before_backward(k, kCount, loss);
      loss.backward();
    }
    reducer.finish_update();
    reduced[rank] = grads_of(*mlp);
    launched[rank] = reducer.last_timing().buckets;
  });
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    // Nothing was reduced during the first two micro-batches: the gradients are still this rank's own.
    CHECK(max_rel_diff(before_last[r], local_oracle[r]) < 1e-12);
    CHECK(max_rel_diff(reduced[r], oracle) < 1e-12);
    CHECK(launched[r] >= 2);
  }
}

namespace {

// The output layer registered before the hidden one: backward's gradients arrive in another order than the
// first bucket layout's (the reverse of registration), so that the rebuild at update 2 cuts other buckets.
struct HeadFirstNetImpl : torch::nn::Module {
  HeadFirstNetImpl() {
    head = register_module("head", torch::nn::Linear(32, 4));
    body = register_module("body", torch::nn::Linear(6, 32));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head->forward(torch::tanh(body->forward(x))); }
  torch::nn::Linear head{nullptr}, body{nullptr};
};
TORCH_MODULE(HeadFirstNet);

}  // namespace

TEST_CASE("The reducer's path: through shared memory no float allreduce reaches the group and the gradients live "
          "in the segment, also after the rebuild at update 2, and through the group the reverse",
          "[ddp][shm]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 2;
  constexpr int kUpdates = 3;
  const auto path = GENERATE(SharedMemoryReduceMode::kOn, SharedMemoryReduceMode::kOff);
  const bool shm = path == SharedMemoryReduceMode::kOn;
  CAPTURE(shm ? "shared memory" : "process group");
  std::vector<std::vector<int64_t>> float_allreduces(kWorld);  // [rank][update] float allreduces asked of the group
  std::vector<std::vector<int>> in_segment(kWorld);            // [rank][update] gradients_in_shared_memory()
  std::vector<std::vector<int64_t>> buckets(kWorld);           // [rank][update] buckets reduced
  std::vector<std::vector<std::vector<int64_t>>> layouts(kWorld);  // [rank][update] bucket sizes after it
  run_ranks(kWorld, [&](int rank, const Group& group) {
    torch::manual_seed(3);
    HeadFirstNet mlp;
    DdpOptions options;
    options.bucket_cap_mb = 0.0005;  // two buckets, rebuilt in gradient order at update 2: [896, 528] -> [528, 896]
    options.shared_memory = path;
    DistributedReducer reducer(*mlp, group, options);
    hetseq::CountingBackend* counter = hetseq::counting_backend(group);
    if (!counter) throw std::runtime_error("the rank threads' group has no counting backend");
    auto float_allreduces_so_far = [&] {
      int64_t n = 0;
      for (const auto& r : counter->records()) n += r.op == "allreduce" && c10::isFloatingType(r.dtype);
      return n;
    };
    torch::manual_seed(10 + rank);
    const torch::Tensor x = torch::randn({3 + rank, 6}), y = torch::randn({3 + rank, 4});
    for (int update = 0; update < kUpdates; ++update) {
      const int64_t before = float_allreduces_so_far();
      for (auto& p : mlp->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();  // in place, as the Controller does: the views stay
      }
      torch::Tensor loss = (mlp->forward(x) - y).pow(2).sum();
      reducer.before_backward(0, 1, loss);
      loss.backward();
      reducer.finish_update();
      float_allreduces[rank].push_back(float_allreduces_so_far() - before);
      in_segment[rank].push_back(reducer.gradients_in_shared_memory() ? 1 : 0);
      buckets[rank].push_back(reducer.last_timing().buckets);
      layouts[rank].push_back(reducer.bucket_sizes());
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    // The rebuild really cut new buckets (Note [Bucketed reduction]), which take new places in the segment.
    CHECK(layouts[r][0] == std::vector<int64_t>{896, 528});
    CHECK(layouts[r][1] == std::vector<int64_t>{528, 896});
    for (int update = 0; update < kUpdates; ++update) {
      CAPTURE(update);
      CHECK(buckets[r][update] == 2);
      if (shm) {
        CHECK(float_allreduces[r][update] == 0);
        CHECK(in_segment[r][update] == 1);
      } else {
        CHECK(float_allreduces[r][update] == buckets[r][update]);  // one allreduce a bucket
        CHECK(in_segment[r][update] == 0);
      }
    }
  }
}

namespace {

// Three heads on one input; `a` is always used, `b` on request, `never` never.
struct Branchy : torch::nn::Module {
  Branchy() {
    a = register_module("a", torch::nn::Linear(4, 3));
    b = register_module("b", torch::nn::Linear(4, 3));
    never = register_module("never", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_b) {
    torch::Tensor y = a->forward(x);
    if (use_b) y = y + 2 * b->forward(x);
    return y;
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, never{nullptr};
};

}  // namespace

TEST_CASE("find_unused_parameters: parameters unused on some or all ranks", "[ddp]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  // [update][rank] whether rank uses branch b: on some ranks, then on another set, then on none.
  const std::vector<std::vector<bool>> uses_b{{false, true, true}, {false, false, true}, {false, false, false}};
  const torch::Tensor x = torch::arange(8, torch::kFloat32).reshape({2, 4}) / 8;

  const auto path = GENERATE(SharedMemoryReduceMode::kOn, SharedMemoryReduceMode::kOff);
  CAPTURE(path == SharedMemoryReduceMode::kOn ? "shared memory" : "process group");
  for (double cap_mb : {1e-6, 25.0}) {
    CAPTURE(cap_mb);
    std::vector<std::shared_ptr<Branchy>> models;
    for (int r = 0; r < kWorld; ++r) {
      torch::manual_seed(40 + r);
      models.push_back(std::make_shared<Branchy>());
    }
    // [rank][update] gradients by parameter name
    std::vector<std::vector<std::map<std::string, torch::Tensor>>> grads(kWorld);
    run_ranks(kWorld, [&](int rank, const Group& group) {
      auto& model = *models[rank];
      DdpOptions options;
      options.bucket_cap_mb = cap_mb;
      options.find_unused_parameters = true;
      options.shared_memory = path;
      DistributedReducer reducer(model, group, options);
      for (size_t update = 0; update < uses_b.size(); ++update) {
        clear_grads(model);
        torch::Tensor loss = (rank + 1) * model.forward(x, uses_b[update][rank]).sum();
        reducer.before_backward(0, 1, loss);
        loss.backward();
        reducer.finish_update();
        std::map<std::string, torch::Tensor> named;
        for (const auto& item : model.named_parameters()) named[item.key()] = copies({item.value().grad()})[0];
        grads[rank].push_back(named);
      }
    });
    // d/dW of sum(W x + c) is the column sums of x for every row; the bias gets the batch size.
    const torch::Tensor dw = x.sum(0).expand({3, 4});
    const torch::Tensor db = torch::full({3}, 2.0f);
    for (size_t update = 0; update < uses_b.size(); ++update) {
      double b_weight = 0;  // sum over the ranks that use b of 2 * (rank + 1)
      for (int r = 0; r < kWorld; ++r) b_weight += uses_b[update][r] ? 2.0 * (r + 1) : 0.0;
      for (int r = 0; r < kWorld; ++r) {
        CAPTURE(update, r);
        const auto& g = grads[r][update];
        CHECK(torch::allclose(g.at("a.weight"), 6 * dw));
        CHECK(torch::allclose(g.at("a.bias"), 6 * db));
        if (b_weight > 0) {  // used on some ranks: the sum, with zeros from the others
          REQUIRE(g.at("b.weight").defined());
          CHECK(torch::allclose(g.at("b.weight"), b_weight * dw));
          CHECK(torch::allclose(g.at("b.bias"), b_weight * db));
        } else {  // used on no rank: no gradient, as under DDP, so that the optimizer skips it
          CHECK_FALSE(g.at("b.weight").defined());
          CHECK_FALSE(g.at("b.bias").defined());
        }
        CHECK_FALSE(g.at("never.weight").defined());
        CHECK_FALSE(g.at("never.bias").defined());
      }
    }
  }
}

TEST_CASE("find_unused_parameters with accumulation: a parameter used only before the last micro-batch is reduced",
          "[ddp]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  const torch::Tensor x = torch::arange(8, torch::kFloat32).reshape({2, 4}) / 8;
  std::vector<std::shared_ptr<Branchy>> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(std::make_shared<Branchy>());
  std::vector<std::map<std::string, torch::Tensor>> grads(kWorld);  // [rank] by parameter name
  run_ranks(kWorld, [&](int rank, const Group& group) {
    auto& model = *models[rank];
    DdpOptions options;
    options.find_unused_parameters = true;
    options.bucket_cap_mb = 1e-6;
    DistributedReducer reducer(model, group, options);
    clear_grads(model);
    for (int k = 0; k < 2; ++k) {  // b only in the first micro-batch, on every rank
      torch::Tensor loss = (rank + 1) * model.forward(x, k == 0).sum();
      reducer.before_backward(k, 2, loss);
      loss.backward();
    }
    reducer.finish_update();
    for (const auto& item : model.named_parameters()) grads[rank][item.key()] = copies({item.value().grad()})[0];
  });
  const torch::Tensor dw = x.sum(0).expand({3, 4});
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(torch::allclose(grads[r].at("a.weight"), 2 * 6 * dw));  // both micro-batches, all ranks
    CHECK(torch::allclose(grads[r].at("b.weight"), 2 * 6 * dw));  // the first micro-batch, all ranks
    CHECK_FALSE(grads[r].at("never.weight").defined());
  }
}

TEST_CASE("Without find_unused_parameters an unused parameter is an error that names it, not a hang", "[ddp]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 2;
  std::vector<std::shared_ptr<Branchy>> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(std::make_shared<Branchy>());
  const torch::Tensor x = torch::ones({2, 4});
  auto errors = run_ranks_collect(kWorld, [&](int rank, const Group& group) {
    DistributedReducer reducer(*models[rank], group, DdpOptions{});
    torch::Tensor loss = models[rank]->forward(x, true).sum();  // `never` gets no gradient
    reducer.before_backward(0, 1, loss);
    loss.backward();
    reducer.finish_update();
  });
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    REQUIRE(errors[r]);
    CHECK(is_a<hetseq::InputError>(errors[r]));
    CHECK_THAT(message_of(errors[r]), Catch::Contains("never.weight") && Catch::Contains("--find-unused-parameters"));
  }
}

TEST_CASE("Statistics channel: fast and gathered sync agree and names must match only with fast sync", "[ddp][channel]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  auto local_of = [](int rank) {
    return LogSums{{"loss", 0.25 * (rank + 1)}, {"nll_loss", -1.5 * rank}, {"sample_size", 3.0 + rank}};
  };
  const LogSums expected{{"loss", 1.5}, {"nll_loss", -4.5}, {"sample_size", 12}};
  auto valid_of = [](int rank) { return LogSums{{"loss", 2.0 * rank}, {"sample_size", 1.0}}; };
  const LogSums expected_valid{{"loss", 6}, {"sample_size", 3}};

  for (bool fast : {false, true}) {
    CAPTURE(fast);
    std::vector<torch::nn::Linear> models;
    for (int r = 0; r < kWorld; ++r) models.emplace_back(torch::nn::Linear(2, 2));
    std::vector<std::vector<LogSums>> got(kWorld);       // [rank][call]
    std::vector<size_t> per_rank_size(kWorld);
    run_ranks(kWorld, [&](int rank, const Group& group) {
      GroupChannel channel(group, torch::kCPU, fast);
      // Names change on every rank together between calls 2 and 3 and back (training, validation).
      for (int call = 0; call < 6; ++call) {
        const bool valid = call == 3 || call == 4;
        got[rank].push_back(channel.sum(valid ? valid_of(rank) : local_of(rank)));
      }
      per_rank_size[rank] = channel.last_per_rank().size();
    });
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      for (int call = 0; call < 6; ++call) {
        CAPTURE(call);
        CHECK(got[r][call] == (call == 3 || call == 4 ? expected_valid : expected));
      }
      CHECK(per_rank_size[r] == (fast ? 0u : 3u));
    }
  }

  SECTION("a rank without statistics (no validation batch) gets the others' sums, with and without fast sync") {
    for (bool fast : {false, true}) {
      CAPTURE(fast);
      std::vector<torch::nn::Linear> models;
      for (int r = 0; r < kWorld; ++r) models.emplace_back(torch::nn::Linear(2, 2));
      std::vector<std::vector<LogSums>> got(kWorld);
      run_ranks(kWorld, [&](int rank, const Group& group) {
        GroupChannel channel(group, torch::kCPU, fast);
        got[rank].push_back(channel.sum(local_of(rank)));                          // training
        got[rank].push_back(channel.sum(rank == 1 ? LogSums{} : valid_of(rank)));  // rank 1: no batch
        got[rank].push_back(channel.sum(local_of(rank)));                          // training again
      });
      for (int r = 0; r < kWorld; ++r) {
        CAPTURE(r);
        CHECK(got[r][0] == expected);
        CHECK(got[r][1] == LogSums{{"loss", 4}, {"sample_size", 2}});  // ranks 0 and 2
        CHECK(got[r][2] == expected);
      }
    }
  }

  SECTION("different names: the union without fast sync, an error naming the ranks with it") {
    // Rank 2 reports an extra name, from the first call on or only from the second.
    for (int first_bad_call : {0, 1}) {
      for (bool fast : {false, true}) {
        CAPTURE(first_bad_call, fast);
        std::vector<torch::nn::Linear> models;
        for (int r = 0; r < kWorld; ++r) models.emplace_back(torch::nn::Linear(2, 2));
        std::vector<std::vector<LogSums>> got(kWorld);
        auto errors = run_ranks_collect(kWorld, [&](int rank, const Group& group) {
          GroupChannel channel(group, torch::kCPU, fast);
          for (int call = 0; call < 2; ++call) {
            LogSums local = local_of(rank);
            if (rank == 2 && call >= first_bad_call) local["ncorrect"] = 5;
            got[rank].push_back(channel.sum(local));
          }
        });
        for (int r = 0; r < kWorld; ++r) {
          CAPTURE(r);
          if (fast) {
            REQUIRE(errors[r]);
            CHECK(is_a<hetseq::InputError>(errors[r]));
            CHECK_THAT(message_of(errors[r]),
                       Catch::Contains("--fast-stat-sync") && Catch::Contains("ranks [0, 1]") &&
                           Catch::Contains("ranks [2]"));
            CHECK(got[r].size() == static_cast<size_t>(first_bad_call));
          } else {
            REQUIRE_FALSE(errors[r]);
            LogSums with_extra = expected;
            with_extra["ncorrect"] = 5;
            CHECK(got[r].back() == with_extra);
          }
        }
      }
    }
  }
}

TEST_CASE("A peer that never reaches the collective gives an exception within the timeout", "[ddp]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  constexpr int kSilent = 2;
  const auto timeout = std::chrono::seconds(2);
  std::vector<torch::nn::Linear> models;
  for (int r = 0; r < kWorld; ++r) models.emplace_back(torch::nn::Linear(4, 4));
  std::vector<Group> kept(kWorld);  // the silent rank's group stays open: a stalled peer, not a closed one
  std::vector<std::unique_ptr<DistributedReducer>> reducers(kWorld);
  std::vector<std::unique_ptr<GroupChannel>> channels(kWorld);
  // The silent rank itself saw nothing; every other rank failed with an InputError that names it, says
  // `what` failed, and gives Gloo's cause: the group's timeout for a stalled peer; for a peer that
  // closed its group, the closed socket ("Connection closed by peer" or "... reset by peer", by timing).
  enum class Cause { kTimeout, kPeerLeft };
  auto check_peers_failed = [&](const auto& errors, const std::string& what, Cause cause) {
    CHECK_FALSE(errors[kSilent]);
    for (int r = 0; r < kWorld; ++r) {
      if (r == kSilent) continue;
      CAPTURE(r);
      REQUIRE(errors[r]);
      CHECK(is_a<hetseq::InputError>(errors[r]));
      const std::string message = message_of(errors[r]);
      CHECK_THAT(message, Catch::StartsWith("rank " + std::to_string(r) + " of 3: " + what));
      if (cause == Cause::kTimeout) {
        CHECK_THAT(message, Catch::Contains("Timed out waiting 2000ms for"));
      } else {
        CHECK_THAT(message, Catch::Contains("Connection closed by peer") || Catch::Contains("Connection reset by peer"));
      }
    }
  };

  SECTION("gradient allreduce") {
    const auto start = std::chrono::steady_clock::now();
    auto errors = run_ranks_collect(
        kWorld,
        [&](int rank, const Group& group) {
          kept[rank] = group;
          reducers[rank] = std::make_unique<DistributedReducer>(*models[rank], group, hetseq::test::ddp_over_group());
          if (rank == kSilent) return;
          torch::Tensor loss = models[rank]->forward(torch::ones({1, 4})).sum();
          reducers[rank]->before_backward(0, 1, loss);
          loss.backward();
          reducers[rank]->finish_update();
        },
        timeout);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(elapsed < 15);
    check_peers_failed(errors, "the allreduce of gradient bucket 0 (80 bytes) failed: ", Cause::kTimeout);
  }

  SECTION("gradient allreduce, the peer having left (its group closed)") {
    auto errors = run_ranks_collect(
        kWorld,
        [&](int rank, const Group& group) {
          DistributedReducer reducer(*models[rank], group, hetseq::test::ddp_over_group());
          if (rank == kSilent) return;  // the reducer and the group close here
          torch::Tensor loss = models[rank]->forward(torch::ones({1, 4})).sum();
          reducer.before_backward(0, 1, loss);
          loss.backward();
          reducer.finish_update();
        },
        timeout);
    check_peers_failed(errors, "the allreduce of gradient bucket 0 (80 bytes) failed: ", Cause::kPeerLeft);
  }

  SECTION("statistics") {
    for (bool fast : {false, true}) {
      CAPTURE(fast);
      auto errors = run_ranks_collect(
          kWorld,
          [&](int rank, const Group& group) {
            kept[rank] = group;
            channels[rank] = std::make_unique<GroupChannel>(group, torch::kCPU, fast);
            if (rank == kSilent) return;
            channels[rank]->sum({{"loss", 1}});
          },
          timeout);
      check_peers_failed(errors,
                         fast ? "the allreduce (--fast-stat-sync) of the statistics failed: "
                              : "the allgather of the statistics failed: ",
                         Cause::kTimeout);
      channels = std::vector<std::unique_ptr<GroupChannel>>(kWorld);
      kept = std::vector<Group>(kWorld);
    }
  }

  SECTION("a gather of per-rank figures") {
    auto errors = run_ranks_collect(
        kWorld,
        [&](int rank, const Group& group) {
          kept[rank] = group;
          channels[rank] = std::make_unique<GroupChannel>(group, torch::kCPU, false);
          if (rank == kSilent) return;
          channels[rank]->gather({1.0, 2.0});
        },
        timeout);
    check_peers_failed(errors, "the allgather of 2 per-rank figures failed: ", Cause::kTimeout);
  }
}

TEST_CASE("Channel gather: every rank gets every rank's figures, in rank order, exactly", "[ddp][channel]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  std::vector<std::vector<std::vector<double>>> got(kWorld);  // [rank][rank seen][k]
  run_ranks(kWorld, [&](int rank, const Group& group) {
    GroupChannel channel(group, torch::kCPU, false);
    // Values that a sum of zeros elsewhere would still give, and ones it would not (-0.0, NaN payloads are
    // not used): a third of 1, a large odd integer, the rank itself.
    got[rank] = channel.gather({1.0 / 3 + rank, 9007199254740991.0 - rank, static_cast<double>(rank)});
  });
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    REQUIRE(got[r].size() == kWorld);
    for (int q = 0; q < kWorld; ++q) {
      CHECK(got[r][q] == std::vector<double>{1.0 / 3 + q, 9007199254740991.0 - q, static_cast<double>(q)});
    }
  }
}
