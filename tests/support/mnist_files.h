#pragma once
// Small MNIST-format data sets for tests that need whole epochs quickly: IDX files of random images,
// or the first samples of real ones.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

namespace hetseq::test {

/// Writes train-{images-idx3,labels-idx1}-ubyte with `train` samples and t10k-... with `test` samples
/// of random 28x28 images and labels 0-9 into `dir` (which must exist), drawn from `seed`.
void write_random_mnist(const std::string& dir, int64_t train, int64_t test, uint32_t seed = 1);

/// Writes the first `train` and `test` samples of the Fashion-MNIST files in `source` (as shipped,
/// gzipped or not) as plain IDX files into `dir`: real data for tests whose time goes into
/// validation passes (bf16 on a CPU without bf16 instructions takes about 0.4 s per 32 samples).
void write_mnist_prefix(const std::string& source, const std::string& dir, int64_t train, int64_t test);

/// The directory of the first `train` and `test` samples of the shipped Fashion-MNIST (fashion_mnist_dir()),
/// written by write_mnist_prefix once per test process and size, and removed when the process exits: real data
/// for multi-process tests, without every rank of every run loading and normalising all 60000 images.
const std::string& fashion_mnist_prefix(int64_t train, int64_t test);

/// The parameters of the MNIST model saved in `checkpoint` (a hetseq checkpoint or model file).
std::vector<torch::Tensor> mnist_params_of(const std::string& checkpoint);

}  // namespace hetseq::test
