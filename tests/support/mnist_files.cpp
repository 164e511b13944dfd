#include "support/mnist_files.h"

#include <fstream>
#include <random>
#include <stdexcept>
#include <vector>

#include "tasks/mnist/idx_reader.h"

namespace hetseq::test {
namespace {

void append_big_endian(std::vector<char>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

void write_idx(const std::string& path, uint32_t magic, const std::vector<uint32_t>& sizes, std::mt19937& rng,
               int modulo) {
  std::vector<char> bytes;
  append_big_endian(bytes, magic);
  size_t count = 1;
  for (uint32_t s : sizes) {
    append_big_endian(bytes, s);
    count *= s;
  }
  for (size_t i = 0; i < count; ++i) bytes.push_back(static_cast<char>(rng() % static_cast<uint32_t>(modulo)));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) throw std::runtime_error("cannot write " + path);
}

}  // namespace

void write_random_mnist(const std::string& dir, int64_t train, int64_t test, uint32_t seed) {
  std::mt19937 rng(seed);
  for (const auto& [prefix, n] : {std::pair<std::string, int64_t>{"train", train}, {"t10k", test}}) {
    const auto count = static_cast<uint32_t>(n);
    write_idx(dir + "/" + prefix + "-images-idx3-ubyte", 0x803, {count, 28, 28}, rng, 256);
    write_idx(dir + "/" + prefix + "-labels-idx1-ubyte", 0x801, {count}, rng, 10);
  }
}

void write_mnist_prefix(const std::string& source, const std::string& dir, int64_t train, int64_t test) {
  for (const auto& [prefix, n] : {std::pair<std::string, int64_t>{"train", train}, {"t10k", test}}) {
    const auto images = mnist::read_idx_images(source + "/" + prefix + "-images-idx3-ubyte.gz").slice(0, 0, n).contiguous();
    const auto labels = mnist::read_idx_labels(source + "/" + prefix + "-labels-idx1-ubyte.gz").slice(0, 0, n).to(torch::kUInt8);
    const auto count = static_cast<uint32_t>(images.size(0));
    for (const auto& [name, magic, tensor] :
         {std::tuple<std::string, uint32_t, torch::Tensor>{"-images-idx3-ubyte", 0x803, images},
          {"-labels-idx1-ubyte", 0x801, labels}}) {
      std::vector<char> bytes;
      append_big_endian(bytes, magic);
      append_big_endian(bytes, count);
      if (magic == 0x803) {
        append_big_endian(bytes, static_cast<uint32_t>(images.size(1)));
        append_big_endian(bytes, static_cast<uint32_t>(images.size(2)));
      }
      const auto* data = static_cast<const char*>(tensor.data_ptr());
      bytes.insert(bytes.end(), data, data + tensor.numel());
      std::ofstream out(dir + "/" + prefix + name, std::ios::binary);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (!out.good()) throw std::runtime_error("cannot write " + dir + "/" + prefix + name);
    }
  }
}

}  // namespace hetseq::test
