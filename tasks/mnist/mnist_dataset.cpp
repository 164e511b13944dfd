#include "tasks/mnist/mnist_dataset.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "tasks/mnist/idx_reader.h"

namespace hetseq::mnist {
namespace {

constexpr int64_t kImageSide = 28;  // the model's fc1 expects 28x28 inputs
constexpr int64_t kNumClasses = 10;

}  // namespace

MnistSplit read_mnist_split(const MnistFiles& files) {
  MnistSplit split{read_idx_images(files.images), read_idx_labels(files.labels)};
  if (split.images.size(1) != kImageSide || split.images.size(2) != kImageSide) {
    throw InputError(fmt::format("{}: the images are {}x{} pixels, but the MNIST model takes {}x{}; is this an MNIST "
                                 "or Fashion-MNIST file?",
                                 files.images, split.images.size(1), split.images.size(2), kImageSide, kImageSide));
  }
  if (split.images.size(0) != split.labels.size(0)) {
    throw InputError(fmt::format("{} holds {} images but {} holds {} labels; the two files must belong to the same "
                                 "split, download them again",
                                 files.images, split.images.size(0), files.labels, split.labels.size(0)));
  }
  if (split.labels.numel() > 0) {
    const int64_t lowest = split.labels.min().item<int64_t>();
    const int64_t highest = split.labels.max().item<int64_t>();
    if (lowest < 0 || highest >= kNumClasses) {
      throw InputError(fmt::format("{}: labels range over {}..{}, but MNIST has classes 0..{}; is this an MNIST or "
                                   "Fashion-MNIST label file?",
                                   files.labels, lowest, highest, kNumClasses - 1));
    }
  }
  return split;
}

PixelStats compute_pixel_stats(const torch::Tensor& images) {
  HETSEQ_ASSERT(images.scalar_type() == torch::kUInt8, "pixel statistics need uint8 images, got {}",
                std::string(c10::toString(images.scalar_type())));
  const torch::Tensor pixels = images.to(torch::kCPU).contiguous();
  // An exact histogram instead of a float reduction: no rounding drift and no float copy of the split.
  std::array<int64_t, 256> counts{};  // [pixel value]
  const uint8_t* data = pixels.data_ptr<uint8_t>();
  const int64_t n = pixels.numel();
  for (int64_t i = 0; i < n; ++i) ++counts[data[i]];
  double sum = 0;
  double sum_squares = 0;
  for (int v = 0; v < 256; ++v) {
    const double x = v / 255.0;
    sum += static_cast<double>(counts[v]) * x;
    sum_squares += static_cast<double>(counts[v]) * x * x;
  }
  const double mean = n > 0 ? sum / static_cast<double>(n) : 0.0;
  const double variance = n > 0 ? std::max(0.0, sum_squares / static_cast<double>(n) - mean * mean) : 0.0;
  if (!(variance > 0)) {
    throw InputError(fmt::format("the {} pixels of the train images are all equal (or there are none), so they "
                                 "cannot be normalised; check the train image file",
                                 n));
  }
  return PixelStats{mean, std::sqrt(variance)};
}

MnistDataset::MnistDataset(MnistSplit split, PixelStats stats)
    : images_(std::move(split.images)), labels_(std::move(split.labels)), stats_(stats) {
  HETSEQ_ASSERT(images_.dim() == 3 && images_.size(1) == kImageSide && images_.size(2) == kImageSide &&
                    images_.scalar_type() == torch::kUInt8,
                "MNIST images must be uint8 [N, 28, 28], got {} {}", std::string(c10::toString(images_.scalar_type())),
                fmt::join(images_.sizes(), "x"));
  HETSEQ_ASSERT(labels_.dim() == 1 && labels_.size(0) == images_.size(0) && labels_.scalar_type() == torch::kInt64,
                "MNIST labels must be int64 [{}], got {} [{}]", images_.size(0),
                std::string(c10::toString(labels_.scalar_type())), fmt::join(labels_.sizes(), "x"));
  HETSEQ_ASSERT(stats_.std > 0, "pixel standard deviation must be positive, got {}", stats_.std);
}

int64_t MnistDataset::size() const { return images_.size(0); }

Batch MnistDataset::collate(const std::vector<int64_t>& indices) const {
  const int64_t n = static_cast<int64_t>(indices.size());
  for (const int64_t i : indices) {
    HETSEQ_ASSERT(i >= 0 && i < size(), "sample index {} outside the MNIST split of {} samples", i, size());
  }
  const torch::Tensor index = torch::tensor(indices, torch::kInt64);  // [n]
  torch::Tensor input = images_.index_select(0, index).to(torch::kFloat32);
  input.div_(255.0).sub_(stats_.mean).div_(stats_.std);
  Batch batch;
  batch.fields.emplace("input", input.unsqueeze(1));  // [n, 1, 28, 28]
  batch.fields.emplace("target", labels_.index_select(0, index));
  batch.num_samples = n;
  return batch;
}

}  // namespace hetseq::mnist
