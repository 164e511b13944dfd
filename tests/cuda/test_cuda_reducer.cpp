// The DistributedReducer with CUDA gradients (ranks as processes where a backward pass runs: Note [CUDA backward
// needs a process per rank], support/rank_processes.h; as threads otherwise): --find-unused-parameters on
// ranks as processes whose models live on GPU 0 and whose Gloo groups carry CUDA tensors (the GPU counterpart of
// "find_unused_parameters: parameters unused on some or all ranks" in tests/reduce/test_ddp_reducer.cpp),
// NCCL at world size 1, and --shared-memory-reduce with CUDA parameters. Skipped, visibly, where no CUDA device
// is (see cuda/cuda_skip.h).
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "cuda/cuda_skip.h"
#include "hetseq/core/error.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/world/process_group.h"
#include "support/rank_processes.h"
#include "support/rank_threads.h"
#include "support/temp_dir.h"

using hetseq::DdpOptions;
using hetseq::DistributedReducer;
using hetseq::test::cuda_or_skip;
using hetseq::test::Group;
using hetseq::test::run_ranks;

namespace {

// Three heads on one input; `a` is always used, `b` on request, `never` never.
struct CudaBranchy : torch::nn::Module {
  CudaBranchy() {
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

// One rank of the test below (hidden: run by it, in a process of its own, Note [CUDA backward needs a process per
// rank]): three updates with branch b used per kUsesB, writing each update's gradients (those defined) and the
// number of gradients found off cuda:0 to its folder.
const std::vector<std::vector<bool>> kUsesB{{false, true, true}, {false, false, true}, {false, false, false}};
constexpr const char* kUnusedRank = "CUDA: find_unused_parameters rank";
TEST_CASE(kUnusedRank, "[.][cuda_unused_rank]") {
  const auto me = hetseq::test::rank_process();
  const torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(40 + me.rank);
  auto model = std::make_shared<CudaBranchy>();
  model->to(gpu);
  DdpOptions options;
  options.bucket_cap_mb = std::stod(std::getenv("HETSEQ_TEST_CAP_MB"));
  options.find_unused_parameters = true;
  DistributedReducer reducer(*model, me.group, options);
  const torch::Tensor input = (torch::arange(8, torch::kFloat32).reshape({2, 4}) / 8).to(gpu);
  torch::serialize::OutputArchive archive;
  int64_t off_gpu = 0;
  for (size_t update = 0; update < kUsesB.size(); ++update) {
    for (auto& p : model->parameters()) p.mutable_grad().reset();
    torch::Tensor loss = (me.rank + 1) * model->forward(input, kUsesB[update][me.rank]).sum();
    reducer.before_backward(0, 1, loss);
    loss.backward();
    reducer.finish_update();
    for (const auto& item : model->named_parameters()) {
      const torch::Tensor g = item.value().grad();
      if (!g.defined()) continue;
      if (g.device() != gpu) ++off_gpu;
      archive.write(std::to_string(update) + "/" + item.key(), g.detach().cpu());
    }
  }
  archive.write("off_gpu", torch::tensor(off_gpu));
  archive.save_to(me.dir + "/rank" + std::to_string(me.rank) + ".pt");
}

TEST_CASE("CUDA: find_unused_parameters with CUDA gradients: parameters unused on some or all ranks",
          "[cuda][ddp]") {
  if (!cuda_or_skip()) return;
  constexpr int kWorld = 3;
  // [update][rank] whether rank uses branch b (kUsesB): on some ranks, then on another set, then on none.
  const torch::Tensor x = torch::arange(8, torch::kFloat32).reshape({2, 4}) / 8;
  for (double cap_mb : {1e-6, 25.0}) {
    CAPTURE(cap_mb);
    hetseq::test::TempDir dir;
    const auto ranks = hetseq::test::run_rank_processes(kUnusedRank, kWorld, dir.path(), std::chrono::seconds(120),
                                                        {{"HETSEQ_TEST_CAP_MB", std::to_string(cap_mb)}});
    std::vector<torch::serialize::InputArchive> saved(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      INFO("rank " << r << " stdout:\n" << ranks[r].out << "\nstderr:\n" << ranks[r].err);
      REQUIRE_FALSE(ranks[r].timed_out);
      REQUIRE(ranks[r].exit_code == 0);
      saved[r].load_from(dir / ("rank" + std::to_string(r) + ".pt"));
      torch::Tensor off_gpu;
      saved[r].read("off_gpu", off_gpu);
      CHECK(off_gpu.item<int64_t>() == 0);  // every gradient that arrived stays on cuda:0
    }
    // d/dW of sum(W x + c) is the column sums of x for every row; the bias gets the batch size.
    const torch::Tensor dw = x.sum(0).expand({3, 4});
    const torch::Tensor db = torch::full({3}, 2.0f);
    for (size_t update = 0; update < kUsesB.size(); ++update) {
      double b_weight = 0;  // sum over the ranks that use b of 2 * (rank + 1)
      for (int r = 0; r < kWorld; ++r) b_weight += kUsesB[update][r] ? 2.0 * (r + 1) : 0.0;
      for (int r = 0; r < kWorld; ++r) {
        CAPTURE(update, r);
        auto grad = [&](const std::string& name) {
          torch::Tensor g;
          saved[r].try_read(std::to_string(update) + "/" + name, g);
          return g;  // undefined: no gradient
        };
        REQUIRE(grad("a.weight").defined());
        CHECK(torch::allclose(grad("a.weight"), 6 * dw));
        CHECK(torch::allclose(grad("a.bias"), 6 * db));
        if (b_weight > 0) {  // used on some ranks: the sum, with zeros from the others
          REQUIRE(grad("b.weight").defined());
          CHECK(torch::allclose(grad("b.weight"), b_weight * dw));
          CHECK(torch::allclose(grad("b.bias"), b_weight * db));
        } else {  // used on no rank: no gradient, as under DDP, so that the optimizer skips it
          CHECK_FALSE(grad("b.weight").defined());
          CHECK_FALSE(grad("b.bias").defined());
        }
        CHECK_FALSE(grad("never.weight").defined());
        CHECK_FALSE(grad("never.bias").defined());
      }
    }
  }
}

TEST_CASE("CUDA: NCCL at world size 1: an allreduce and the reducer's buckets leave a rank's gradients as they are",
          "[cuda][ddp][nccl]") {
  if (!cuda_or_skip()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  hetseq::ProcessGroupOptions options;
  options.backend = "nccl";
  options.timeout = std::chrono::seconds(60);
  const auto group = hetseq::make_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, options);
  std::vector<torch::Tensor> tensors{torch::arange(1000, torch::TensorOptions(torch::kFloat32).device(gpu))};
  group->allreduce(tensors)->wait();
  CHECK(torch::equal(tensors[0].cpu(), torch::arange(1000, torch::kFloat32)));

  torch::manual_seed(7);
  torch::nn::Sequential mlp(torch::nn::Linear(5, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
  mlp->to(gpu);
  const torch::Tensor x = torch::randn({8, 5}).to(gpu);
  // The gradients of one backward without a reducer, then with one (several buckets).
  mlp->forward(x).square().sum().backward();
  std::vector<torch::Tensor> local;
  for (auto& p : mlp->parameters()) {
    local.push_back(p.grad().detach().cpu().clone());
    p.mutable_grad().reset();
  }
  DdpOptions ddp;
  ddp.bucket_cap_mb = 1e-4;
  DistributedReducer reducer(*mlp, group, ddp);
  torch::Tensor loss = mlp->forward(x).square().sum();
  reducer.before_backward(0, 1, loss);
  loss.backward();
  reducer.finish_update();
  const auto params = mlp->parameters();
  REQUIRE(params.size() == local.size());
  for (size_t i = 0; i < params.size(); ++i) {
    CAPTURE(i);
    REQUIRE(params[i].grad().defined());
    CHECK(params[i].grad().device() == gpu);
    CHECK(torch::equal(params[i].grad().cpu(), local[i]));
  }
}

// One rank of the second half of the test below (hidden: run by it, in a process of its own): a model on the GPU
// (or on the CPU for rank 0 when HETSEQ_TEST_BOTH_ON_GPU is 0), one update under --shared-memory-reduce auto;
// writes whether its gradients went through shared memory.
constexpr const char* kAutoRank = "CUDA: shared-memory-reduce auto rank";
TEST_CASE(kAutoRank, "[.][cuda_shm_auto_rank]") {
  const auto me = hetseq::test::rank_process();
  const bool on_gpu = std::string(std::getenv("HETSEQ_TEST_BOTH_ON_GPU")) == "1" || me.rank == 1;
  torch::manual_seed(5);
  torch::nn::Linear model(4, 3);
  if (on_gpu) model->to(torch::Device(torch::kCUDA, 0));
  DistributedReducer reducer(*model, me.group, DdpOptions{});  // auto
  torch::Tensor loss = model->forward(torch::ones({2, 4}, model->weight.options())).sum();
  reducer.before_backward(0, 1, loss);
  loss.backward();
  reducer.finish_update();
  std::ofstream(me.dir + "/rank" + std::to_string(me.rank))
      << "in shared memory: " << (reducer.gradients_in_shared_memory() ? 1 : 0) << "\n";
}

TEST_CASE("CUDA: --shared-memory-reduce on with CUDA parameters is a usage error on every rank, a CPU rank beside "
          "them included, and auto leaves the buckets on the group",
          "[cuda][ddp][shm]") {
  if (!cuda_or_skip()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  // [rank] whether its model is on the GPU: both, or a CPU rank 0 beside a GPU rank 1 (a heterogeneous world).
  const bool both_on_gpu = GENERATE(true, false);
  CAPTURE(both_on_gpu);
  auto on_gpu = [&](int rank) { return both_on_gpu || rank == 1; };
  auto model_of = [&](int rank) {
    torch::manual_seed(5);
    torch::nn::Linear model(4, 3);
    if (on_gpu(rank)) model->to(gpu);
    return model;
  };
  const auto errors = hetseq::test::run_ranks_collect(2, [&](int rank, const Group& group) {
    torch::nn::Linear model = model_of(rank);
    DdpOptions options;
    options.shared_memory = hetseq::SharedMemoryReduceMode::kOn;
    DistributedReducer reducer(*model, group, options);
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(errors[static_cast<size_t>(r)]);
    const std::string message = hetseq::test::message_of(errors[static_cast<size_t>(r)]);
    INFO(message);
    CHECK(hetseq::test::is_a<hetseq::UsageError>(errors[static_cast<size_t>(r)]));
    if (on_gpu(r)) {
      CHECK_THAT(message, Catch::Contains("--shared-memory-reduce on: rank " + std::to_string(r) +
                                          " has parameters on cuda:0; it sums CPU gradients only: use auto or off"));
    } else {
      CHECK_THAT(message, Catch::Contains("--shared-memory-reduce on: rank 1 runs on another machine than rank 0") &&
                              Catch::Contains("has its parameters off the CPU"));
    }
  }
  // auto, with a backward pass: a process per rank (Note [CUDA backward needs a process per rank]).
  hetseq::test::TempDir dir;
  const auto ranks = hetseq::test::run_rank_processes(kAutoRank, 2, dir.path(), std::chrono::seconds(120),
                                                      {{"HETSEQ_TEST_BOTH_ON_GPU", both_on_gpu ? "1" : "0"}});
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << " stdout:\n" << ranks[r].out << "\nstderr:\n" << ranks[r].err);
    REQUIRE_FALSE(ranks[r].timed_out);
    REQUIRE(ranks[r].exit_code == 0);
    std::ifstream in(dir / ("rank" + std::to_string(r)));
    std::string line;
    REQUIRE(std::getline(in, line));
    CHECK(line == "in shared memory: 0");  // auto leaves CUDA buckets on the group
  }
}
