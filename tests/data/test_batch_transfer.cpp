// Batches on their way to the device (Note [Batches to the device]), the parts that run on a CPU rank: the move
// to the CPU shares the tensors, the loader pins nothing unless asked, and asking where CUDA is absent is an
// error. The pinned copy on a side stream is tested where a GPU is (tests/cuda/test_cuda_batch_copy.cpp); the
// CPU training tests run the training loop with its default pin_batches = true on a CPU device, which must not
// pin (the loader would throw here).
#include <catch2/catch.hpp>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/data/batch_loader.h"

using namespace hetseq;

namespace {

class RangeDataset : public Dataset {
 public:
  int64_t size() const override { return 100; }
  Batch collate(const std::vector<int64_t>& indices) const override {
    Batch b;
    b.fields["x"] = torch::tensor(indices, torch::kInt64).to(torch::kFloat32).unsqueeze(1).repeat({1, 3});
    b.fields["y"] = torch::tensor(indices, torch::kInt64);
    b.num_samples = static_cast<int64_t>(indices.size());
    return b;
  }
};

}  // namespace

TEST_CASE("A batch moved to the CPU shares its tensors and keeps its sample count", "[data][transfer]") {
  const Batch batch = RangeDataset().collate({4, 7, 9});
  CHECK_FALSE(batch.pinned());
  CHECK_FALSE(Batch{}.pinned());  // no tensors: nothing to copy asynchronously
  const Batch moved = batch.to(torch::kCPU);
  CHECK(moved.num_samples == 3);
  REQUIRE(moved.fields.size() == 2);
  for (const auto& [name, tensor] : batch.fields) {
    INFO(name);
    CHECK(moved.at(name).data_ptr() == tensor.data_ptr());
  }
}

TEST_CASE("The batch loader pins only when asked, and asking without CUDA is an error", "[data][transfer]") {
  auto dataset = std::make_shared<RangeDataset>();
  for (const int64_t workers : {0, 2}) {
    INFO("workers " << workers);
    BatchLoader plain(dataset, workers);
    CHECK_FALSE(plain.submit({1, 2}).get().pinned());
    if (torch::cuda::is_available()) {
      BatchLoader pinning(dataset, BatchLoaderOptions{workers, true});
      CHECK(pinning.submit({1, 2}).get().pinned());
    } else {
      CHECK_THROWS_WITH(BatchLoader(dataset, BatchLoaderOptions{workers, true}),
                        Catch::Contains("a BatchLoader asked to pin batches where CUDA is not available"));
    }
  }
  CHECK_THROWS_WITH(BatchLoader(dataset, BatchLoaderOptions{-1, false}), Catch::Contains("--num-workers: -1"));
}
