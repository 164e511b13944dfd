#include "support/mnist_files.h"

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <vector>

#include "support/temp_dir.h"
#include "support/test_paths.h"
#include "hetseq/checkpoint/checkpoint_file.h"
#include "tasks/mnist/idx_reader.h"
#include "tasks/mnist/mnist_model.h"

namespace hetseq::test {
namespace {

void append_big_endian(std::vector<char>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

// An IDX file: the magic number, the sizes, then their product of bytes from `data`.
void write_idx(const std::string& path, uint32_t magic, const std::vector<uint32_t>& sizes, const char* data) {
  std::vector<char> bytes;
  append_big_endian(bytes, magic);
  size_t count = 1;
  for (uint32_t s : sizes) {
    append_big_endian(bytes, s);
    count *= s;
  }
  bytes.insert(bytes.end(), data, data + count);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) throw std::runtime_error("cannot write " + path);
}

// An IDX file of random bytes below `modulo`.
void write_random_idx(const std::string& path, uint32_t magic, const std::vector<uint32_t>& sizes, std::mt19937& rng,
                      int modulo) {
  size_t count = 1;
  for (uint32_t s : sizes) count *= s;
  std::vector<char> data(count);
  for (auto& b : data) b = static_cast<char>(rng() % static_cast<uint32_t>(modulo));
  write_idx(path, magic, sizes, data.data());
}

}  // namespace

void write_random_mnist(const std::string& dir, int64_t train, int64_t test, uint32_t seed) {
  std::mt19937 rng(seed);
  for (const auto& [prefix, n] : {std::pair<std::string, int64_t>{"train", train}, {"t10k", test}}) {
    const auto count = static_cast<uint32_t>(n);
    write_random_idx(dir + "/" + prefix + "-images-idx3-ubyte", 0x803, {count, 28, 28}, rng, 256);
    write_random_idx(dir + "/" + prefix + "-labels-idx1-ubyte", 0x801, {count}, rng, 10);
  }
}

void write_mnist_prefix(const std::string& source, const std::string& dir, int64_t train, int64_t test) {
  for (const auto& [prefix, n] : {std::pair<std::string, int64_t>{"train", train}, {"t10k", test}}) {
    const std::string from = source + "/" + prefix;
    const auto images = mnist::read_idx_images(from + "-images-idx3-ubyte.gz").slice(0, 0, n).contiguous();
    const auto labels = mnist::read_idx_labels(from + "-labels-idx1-ubyte.gz").slice(0, 0, n).to(torch::kUInt8);
    const auto count = static_cast<uint32_t>(images.size(0));
    write_idx(dir + "/" + prefix + "-images-idx3-ubyte", 0x803,
              {count, static_cast<uint32_t>(images.size(1)), static_cast<uint32_t>(images.size(2))},
              static_cast<const char*>(images.data_ptr()));
    write_idx(dir + "/" + prefix + "-labels-idx1-ubyte", 0x801, {count}, static_cast<const char*>(labels.data_ptr()));
  }
}

const std::string& fashion_mnist_prefix(int64_t train, int64_t test) {
  static std::mutex mutex;
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<TempDir>> dirs;
  const std::lock_guard<std::mutex> lock(mutex);
  auto& dir = dirs[{train, test}];
  if (!dir) {
    auto made = std::make_unique<TempDir>();
    write_mnist_prefix(fashion_mnist_dir(), made->path(), train, test);
    dir = std::move(made);
  }
  return dir->path();
}

std::vector<torch::Tensor> mnist_params_of(const std::string& checkpoint) {
  hetseq::mnist::MnistNet net;
  hetseq::load_model(*net, checkpoint);
  return net->parameters();
}

}  // namespace hetseq::test
