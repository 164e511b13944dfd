#pragma once
// Small MNIST-format data sets for tests that need whole epochs quickly: IDX files of random images.

#include <cstdint>
#include <string>

namespace hetseq::test {

/// Writes train-{images-idx3,labels-idx1}-ubyte with `train` samples and t10k-... with `test` samples
/// of random 28x28 images and labels 0-9 into `dir` (which must exist), drawn from `seed`.
void write_random_mnist(const std::string& dir, int64_t train, int64_t test, uint32_t seed = 1);

}  // namespace hetseq::test
