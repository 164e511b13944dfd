#pragma once
/// A split of MNIST or Fashion-MNIST held in memory, and how it is read and normalised.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "hetseq/data/batch.h"
#include "hetseq/data/dataset.h"

namespace hetseq::mnist {

/// The IDX files of one split (see tasks/mnist/idx_reader.h).
struct MnistFiles {
  std::string images;  // e.g. `<data>/train-images-idx3-ubyte.gz`
  std::string labels;  // e.g. `<data>/train-labels-idx1-ubyte.gz`
};

/// A split as read from its files, checked: `images` uint8 [N, 28, 28], `labels` int64 [N] in 0..9.
struct MnistSplit {
  torch::Tensor images;
  torch::Tensor labels;
};

/// Reads and checks a split. Throws hetseq::InputError naming the file(s) when a file is missing or corrupt,
/// when the images are not 28x28, when a label is not in 0..9, or when the two files hold different numbers
/// of samples (naming both).
MnistSplit read_mnist_split(const MnistFiles& files);

/// Mean and standard deviation of pixel values scaled to [0, 1]; the normalisation is (x - mean) / std.
struct PixelStats {
  double mean = 0;
  double std = 1;
};

/// Computes the exact mean and (population) standard deviation of all pixels of uint8 `images`, scaled to
/// [0, 1]. The task computes them once on the train split and normalises every split with them. Throws
/// hetseq::InputError when all pixels are equal (the standard deviation would be 0).
PixelStats compute_pixel_stats(const torch::Tensor& images);

/// A whole split in memory. Images stay uint8 (a quarter of the memory of floats) and are normalised in
/// collate. Immutable after construction, so collate is safe to call from many threads.
class MnistDataset : public Dataset {
 public:
  /// Holds `split` (as read_mnist_split returns it) and normalises its images with `stats`.
  MnistDataset(MnistSplit split, PixelStats stats);

  int64_t size() const override;
  /// Fields `input` float [n, 1, 28, 28] (normalised) and `target` int64 [n]; num_samples = n. An empty
  /// `indices` gives tensors with n = 0. An index outside [0, size()) is an internal error.
  Batch collate(const std::vector<int64_t>& indices) const override;

  const PixelStats& pixel_stats() const { return stats_; }

 private:
  torch::Tensor images_;  // uint8 [N, 28, 28]
  torch::Tensor labels_;  // int64 [N]
  PixelStats stats_;
};

}  // namespace hetseq::mnist
