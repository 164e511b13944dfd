// Batches to a CUDA device (Note [Batches to the device]): a CUDA rank's loader pins them, the copy runs on a side
// stream without the host waiting, and training with pinned batches is bit for bit training with unpinned ones.
// Skipped, visibly, where no CUDA device is (see cuda/cuda_skip.h); tests/data/test_batch_transfer.cpp checks the
// CPU side.
#include <map>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#ifdef HETSEQ_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "cuda/cuda_skip.h"
#include "hetseq/data/batch_loader.h"
#include "hetseq/optim.h"
#include "hetseq/train/training_loop.h"
#include "support/mnist_files.h"
#include "support/temp_dir.h"
#include "tasks/mnist/mnist_task.h"

using namespace hetseq;
using namespace hetseq::test;

namespace {

class RandomDataset : public Dataset {
 public:
  int64_t size() const override { return 64; }
  Batch collate(const std::vector<int64_t>& indices) const override {
    const auto n = static_cast<int64_t>(indices.size());
    Batch b;
    b.fields["x"] = torch::randn({n, 256});
    b.fields["y"] = torch::tensor(indices, torch::kInt64);
    b.num_samples = n;
    return b;
  }
};

#ifdef HETSEQ_WITH_CUDA
// A host-device synchronisation is an error while it lives (c10's sync debug mode): what the code under test
// must not need.
struct SyncIsAnError {
  SyncIsAnError() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR); }
  ~SyncIsAnError() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED); }
};
#endif

struct Recorder final : TrainingObserver {
  std::vector<double> losses;     // [update]
  std::vector<double> compute_s;  // [update]
  void on_update(const UpdateRecord& r) override {
    losses.push_back(r.result->sums.at("loss"));
    compute_s.push_back(r.times.compute_s);
  }
};

// One epoch of MNIST on cuda:0 with SGD, 2 micro-batches of 16 per update, batches pinned or not.
std::pair<Recorder, std::vector<torch::Tensor>> train_on_cuda(mnist::MnistTask& task, bool pin, int64_t workers) {
  torch::manual_seed(3);
  std::shared_ptr<torch::nn::Module> model = task.build_model();
  model->to(torch::Device(torch::kCUDA, 0));
  auto reducer = std::make_shared<LocalReducer>();
  PlanSchedule schedule({16}, {{2}}, {16}, 0);
  optim::SgdOptions sgd;
  sgd.lr = 0.05;
  auto optimizer = std::make_unique<optim::Sgd>(model->parameters(), sgd);
  optim::FixedOptions fixed;
  fixed.lrs = {0.05};
  auto scheduler = std::make_unique<optim::Fixed>(*optimizer, fixed);
  ControllerOptions copts;
  copts.read_late = false;  // the recorder takes every update's loss as it returns
  copts.clip_norm = 0;
  copts.device = torch::Device(torch::kCUDA, 0);
  Controller controller(task, model, std::move(optimizer), std::move(scheduler), reducer, copts);
  TrainingLoopParts parts{&controller, &schedule, task.load_dataset("train"), {}, nullptr, nullptr};
  TrainingLoopOptions options;
  options.max_epoch = 1;
  options.disable_validation = true;
  options.num_workers = workers;
  options.device = torch::Device(torch::kCUDA, 0);
  options.pin_batches = pin;
  TrainingLoop loop(parts, options);
  auto recorder = std::make_shared<Recorder>();
  loop.add_observer(recorder);
  loop.run(IteratorPosition{1, 0});
  std::vector<torch::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p.detach().cpu());
  return {*recorder, params};
}

}  // namespace

TEST_CASE("CUDA: a pinning loader gives pinned batches, and they reach the GPU on a side stream without a host wait",
          "[cuda][data]") {
  if (!cuda_or_skip()) return;
#ifdef HETSEQ_WITH_CUDA
  auto dataset = std::make_shared<RandomDataset>();
  const torch::Device gpu(torch::kCUDA, 0);
  for (const int64_t workers : {0, 2}) {
    INFO("workers " << workers);
    UpdateStream stream(EpochBatchIterator(64, DataPlan::single(8, 2), EpochIteratorOptions{}),
                        std::make_shared<BatchLoader>(dataset, BatchLoaderOptions{workers, true}));
    stream.begin_epoch(1);
    while (!stream.end_of_epoch()) {
      const std::vector<Batch> batches = stream.next();
      for (const Batch& batch : batches) {
        REQUIRE(batch.pinned());  // before the copy
        Batch on_gpu;
        {
          const SyncIsAnError no_sync;  // a pinned, non-blocking copy on the side stream: the host does not wait
          on_gpu = batch.to(gpu);
        }
        CHECK(on_gpu.num_samples == batch.num_samples);
        for (const auto& [name, tensor] : batch.fields) {
          INFO(name);
          REQUIRE(on_gpu.at(name).device() == gpu);
          // Read on the compute stream, which waits for the side stream's copy.
          CHECK(torch::equal(on_gpu.at(name).cpu(), tensor));
        }
      }
    }
  }
  // The control: an unpinned batch is copied with the host waiting, which the sync debug mode catches.
  const Batch pageable = dataset->collate({1, 2, 3});
  REQUIRE_FALSE(pageable.pinned());
  const SyncIsAnError no_sync;
  CHECK_THROWS(pageable.to(gpu));
#endif
}

TEST_CASE("CUDA: training with pinned batches copied on a side stream equals training with unpinned ones",
          "[cuda][data]") {
  if (!cuda_or_skip()) return;
  TempDir dir;
  write_random_mnist(dir.path(), 320, 10);
  mnist::MnistTaskOptions topts;
  topts.data_dir = dir.path();
  topts.model.dropout1 = topts.model.dropout2 = 0;
  mnist::MnistTask task(topts);
  const auto [plain, plain_params] = train_on_cuda(task, false, 1);
  for (const int64_t workers : {0, 2}) {
    INFO("workers " << workers);
    const auto [pinned, pinned_params] = train_on_cuda(task, true, workers);
    REQUIRE(pinned.losses.size() == 10);
    CHECK(pinned.losses == plain.losses);  // the same bytes reach the same kernels
    REQUIRE(pinned_params.size() == plain_params.size());
    for (size_t i = 0; i < plain_params.size(); ++i) CHECK(torch::equal(pinned_params[i], plain_params[i]));
    // Each update's compute is timed with CUDA events (Note [Compute timing]).
    for (const double s : pinned.compute_s) CHECK(s > 0);
  }
}
