// Training state of the GPU in checkpoints. The CUDA generators (Note [Generator states in checkpoints]): a
// Controller training MNIST on GPU 0 saves every CUDA generator's state, and a fresh Controller that loads the
// checkpoint, after the generators were reseeded as a new process's are, draws dropout on the GPU bit for bit as
// the run that did not stop. PowerSGD on CUDA gradient buckets (Note [PowerSGD in checkpoints]): two ranks as
// threads on GPU 0 over Gloo gather their CUDA error feedback to rank 0, and a restored run continues bit for
// bit. Skipped, visibly, where no CUDA device is (see cuda/cuda_skip.h); the file format and the CPU side are
// checked on the CPU (tests/checkpoint/test_checkpoint_state.cpp, tests/reduce/test_powersgd.cpp).
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "cuda/cuda_skip.h"
#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/checkpoint/training_state.h"
#include "hetseq/reduce/powersgd.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/optim/sgd.h"
#include "hetseq/train/controller.h"
#include "support/mnist_files.h"
#include "support/rank_threads.h"
#include "support/temp_dir.h"
#include "tasks/mnist/mnist_task.h"

using hetseq::test::cuda_or_skip;
using hetseq::test::TempDir;

namespace {

// One Controller on the mnist task over random IDX files on cuda:0, SGD, the default dropout.
struct CudaTrainer {
  std::shared_ptr<hetseq::mnist::MnistTask> task;
  std::shared_ptr<hetseq::Dataset> data;
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<hetseq::Controller> controller;

  explicit CudaTrainer(const std::string& dir) {
    hetseq::mnist::MnistTaskOptions options;
    options.data_dir = dir;
    task = std::make_shared<hetseq::mnist::MnistTask>(options);
    data = task->load_dataset("train");
    torch::manual_seed(3);
    model = task->build_model();
    model->to(torch::Device(torch::kCUDA, 0));
    hetseq::optim::SgdOptions sgd;
    sgd.lr = 0.05;
    auto optimizer = std::make_unique<hetseq::optim::Sgd>(model->parameters(), sgd);
    hetseq::optim::FixedOptions fixed;
    fixed.lrs = {0.05};
    auto scheduler = std::make_unique<hetseq::optim::Fixed>(*optimizer, fixed);
    hetseq::ControllerOptions c;
    c.seed = 7;
    c.device = torch::Device(torch::kCUDA, 0);
    controller = std::make_unique<hetseq::Controller>(*task, model, std::move(optimizer), std::move(scheduler),
                                                      std::make_shared<hetseq::LocalReducer>(), c);
  }

  void update(int64_t u) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 16; ++i) ids.push_back((u * 16 + i) % data->size());
    controller->train_update({data->collate(ids).to(torch::Device(torch::kCUDA, 0))});
  }
};

// What code between two updates draws on the GPU: a dropout mask, from cuda:0's default generator.
torch::Tensor dropout_on_gpu() {
  return torch::dropout(torch::ones({4096}, torch::Device(torch::kCUDA, 0)), 0.5, /*train=*/true).cpu();
}

// PowerSGD that compresses from the first update (the library's default warms up over 100 updates first).
hetseq::PowerSgdOptions compressing_powersgd() {
  hetseq::PowerSgdOptions options;
  options.start_update = 0;
  return options;
}

}  // namespace

TEST_CASE("CUDA: a checkpoint restores every CUDA generator: dropout drawn on the GPU after the resume is the "
          "uninterrupted run's, bit for bit",
          "[cuda][checkpoint][resume]") {
  if (!cuda_or_skip()) return;
  TempDir dir;
  hetseq::test::write_random_mnist(dir.path(), 64, 8);
  CudaTrainer straight(dir.path());
  for (int64_t u = 0; u < 3; ++u) straight.update(u);
  hetseq::Checkpoint saved;
  static_cast<hetseq::TrainingState&>(saved) = straight.controller->state();
  REQUIRE(saved.cuda_rng_states.size() == torch::cuda::device_count());
  hetseq::save_checkpoint(saved, {dir / "ck.pt"});
  const torch::Tensor drawn = dropout_on_gpu();  // the uninterrupted run goes on drawing

  // A new process: its generators seeded afresh (the driver seeds them with --seed before it resumes).
  torch::manual_seed(12345);
  CudaTrainer resumed(dir.path());
  const hetseq::Checkpoint loaded = hetseq::load_checkpoint(dir / "ck.pt");
  hetseq::load_model_tensors(*resumed.model, loaded.model, dir / "ck.pt");
  CHECK_FALSE(torch::equal(dropout_on_gpu(), drawn));  // before the restore: another stream
  torch::manual_seed(12345);
  resumed.controller->load_state(loaded, hetseq::ResumeOptions{}, dir / "ck.pt");
  CHECK(torch::equal(dropout_on_gpu(), drawn));
  const auto again = resumed.controller->state().cuda_rng_states;
  REQUIRE(again.size() == saved.cuda_rng_states.size());
  // Every device's generator came back, not only the one drawn from (cuda:0 moved on since).
  for (size_t i = 1; i < again.size(); ++i) CHECK(torch::equal(again[i], saved.cuda_rng_states[i]));
}

TEST_CASE("CUDA: PowerSGD state of CUDA gradient buckets goes through a checkpoint and the restored run continues "
          "bit for bit",
          "[cuda][checkpoint][powersgd]") {
  if (!cuda_or_skip()) return;
  constexpr int kWorld = 2;
  constexpr int kUpdates = 5;
  constexpr int kSaveAfter = 2;
  const torch::Device gpu(torch::kCUDA, 0);
  const std::vector<std::vector<int64_t>> shapes{{16, 12}, {12}};  // a compressed matrix and a vector
  torch::manual_seed(8);
  std::vector<std::vector<std::vector<torch::Tensor>>> inputs(kUpdates);  // [update][rank][view] on the CPU
  for (auto& update : inputs) {
    for (int r = 0; r < kWorld; ++r) {
      update.emplace_back();
      for (const auto& s : shapes) update.back().push_back(torch::randn(s));
    }
  }
  // One update of bucket 0 on `gpu`; returns the reduced views on the CPU.
  auto reduce = [&](hetseq::PowerSgd& psgd, const std::vector<torch::Tensor>& values) {
    torch::Tensor buffer = torch::zeros({16 * 12 + 12}, gpu);
    std::vector<torch::Tensor> grads{buffer.narrow(0, 0, 16 * 12).view({16, 12}), buffer.narrow(0, 16 * 12, 12)};
    for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(values[i]);
    psgd.begin_update();
    psgd.reduce(0, buffer, grads)->waitAndThrow();
    return buffer.cpu();
  };
  TempDir dir;
  std::vector<std::vector<torch::Tensor>> straight(kWorld), resumed(kWorld);  // [rank][update]
  hetseq::PowerSgdState saved;
  hetseq::test::run_ranks(kWorld, [&](int rank, const hetseq::test::Group& group) {
    hetseq::PowerSgd psgd(group, compressing_powersgd());
    for (int u = 0; u < kUpdates; ++u) {
      straight[rank].push_back(reduce(psgd, inputs[u][rank]));
      if (u == kSaveAfter - 1) {
        hetseq::PowerSgdState s = psgd.gather_state();  // a gather of CUDA tensors over Gloo
        if (rank == 0) saved = s;
      }
    }
  });
  hetseq::Checkpoint c;
  c.powersgd = saved;
  hetseq::save_checkpoint(c, {dir / "ck.pt"});
  const hetseq::PowerSgdState loaded = *hetseq::load_checkpoint(dir / "ck.pt").powersgd;
  REQUIRE(loaded.buckets.size() == 1);
  REQUIRE(loaded.buckets[0].errors[0].sizes().vec() == std::vector<int64_t>{kWorld, 16, 12});
  hetseq::test::run_ranks(kWorld, [&](int rank, const hetseq::test::Group& group) {
    hetseq::PowerSgd psgd(group, compressing_powersgd());
    psgd.load_state(loaded, dir / "ck.pt");
    for (int u = kSaveAfter; u < kUpdates; ++u) resumed[rank].push_back(reduce(psgd, inputs[u][rank]));
  });
  for (int r = 0; r < kWorld; ++r) {
    for (int u = kSaveAfter; u < kUpdates; ++u) {
      CAPTURE(r, u);
      CHECK(torch::equal(resumed[r][u - kSaveAfter], straight[r][u]));
    }
  }
}
