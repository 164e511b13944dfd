#include "support/test_paths.h"

#include <cstdlib>

namespace hetseq::test {
namespace {

std::string from_environment(const char* variable, const std::string& fallback) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

}  // namespace

std::string source_dir() { return from_environment("HETSEQ_TEST_SOURCE_DIR", HETSEQ_SOURCE_DIR); }

std::string binary_dir() { return from_environment("HETSEQ_TEST_BINARY_DIR", HETSEQ_BINARY_DIR); }

std::string python_path() { return from_environment("HETSEQ_TEST_PYTHON", HETSEQ_PYTHON); }

std::string fashion_mnist_dir() {
  return from_environment("HETSEQ_TEST_FASHION_MNIST", "/usr/share/datasets/fashion-mnist");
}

}  // namespace hetseq::test
