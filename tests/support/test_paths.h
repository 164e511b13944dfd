#pragma once
// Where the tests find the source tree, the built programs, the torch Python and Fashion-MNIST: the paths
// of the build by default, each replaceable by an environment variable, so that the test binary also runs
// from a folder copied to another machine (scripts/gpu_check.sh packs one, with a Fashion-MNIST subset).

#include <string>

namespace hetseq::test {

/// The source tree: $HETSEQ_TEST_SOURCE_DIR, else the one this binary was built from.
std::string source_dir();

/// The folder whose bin/ holds hetseq-train, hetseq-eval and hetseq-trace: $HETSEQ_TEST_BINARY_DIR, else
/// the build directory of this binary.
std::string binary_dir();

/// A Python with the torch wheel: $HETSEQ_TEST_PYTHON, else the one found at configure time (empty when
/// none was found).
std::string python_path();

/// Fashion-MNIST's gzipped IDX files: $HETSEQ_TEST_FASHION_MNIST, else Debian's dataset-fashion-mnist
/// (/usr/share/datasets/fashion-mnist).
std::string fashion_mnist_dir();

}  // namespace hetseq::test
