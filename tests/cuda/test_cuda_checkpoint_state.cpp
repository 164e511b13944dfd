// The CUDA generators in checkpoints (Note [Generator states in checkpoints]): a Controller training MNIST on
// GPU 0 saves every CUDA generator's state, and a fresh Controller that loads the checkpoint, after the
// generators were reseeded as a new process's are, draws dropout on the GPU bit for bit as the run that did not
// stop. Skipped, visibly, where no CUDA device is (see cuda/cuda_skip.h); the file format of the states is
// checked on the CPU (tests/checkpoint/test_checkpoint_state.cpp).
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "cuda/cuda_skip.h"
#include "hetseq/checkpoint/checkpoint.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/optim/sgd.h"
#include "hetseq/train/controller.h"
#include "support/mnist_files.h"
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
