// The IDX reader of the mnist task on real files: small IDX files written here (plain and gzipped), the
// installed Fashion-MNIST test split, and one file for each way a file can be corrupt.

#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "tasks/mnist/idx_reader.h"
#include "tasks/mnist/mnist_dataset.h"
#include "support/error_message.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;
using Catch::Contains;
using hetseq::mnist::read_idx_images;
using hetseq::mnist::read_idx_labels;

using hetseq::test::TempDir;
using hetseq::test::input_error_of;

namespace {

constexpr uint32_t kImageMagic = 0x00000803;
constexpr uint32_t kLabelMagic = 0x00000801;


void append_big_endian(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

/// The bytes of an IDX file: magic number, sizes, data. See Note [IDX format].
std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& sizes, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  append_big_endian(out, magic);
  for (const uint32_t s : sizes) append_big_endian(out, s);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_plain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(file) == Z_OK);
}

std::vector<uint8_t> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Pixel values 0, 7, 14, ... (mod 256), `count` of them.
std::vector<uint8_t> ramp(size_t count) {
  std::vector<uint8_t> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<uint8_t>(i * 7);
  return out;
}

}  // namespace

TEST_CASE("IDX images and labels read back exactly, plain and gzipped", "[mnist][idx]") {
  TempDir dir;
  const std::vector<uint8_t> pixels = ramp(3 * 4 * 5);
  const std::vector<uint8_t> labels{7, 0, 9};
  const torch::Tensor expected_images =
      torch::tensor(std::vector<int64_t>(pixels.begin(), pixels.end())).to(torch::kUInt8).reshape({3, 4, 5});

  for (const bool gzip : {false, true}) {
    CAPTURE(gzip);
    const std::string suffix = gzip ? ".gz" : "";
    const std::string images_path = dir.file("images-idx3-ubyte" + suffix);
    const std::string labels_path = dir.file("labels-idx1-ubyte" + suffix);
    const auto write = gzip ? write_gzip : write_plain;
    write(images_path, idx_bytes(kImageMagic, {3, 4, 5}, pixels));
    write(labels_path, idx_bytes(kLabelMagic, {3}, labels));

    const torch::Tensor images = read_idx_images(images_path);
    CHECK(images.scalar_type() == torch::kUInt8);
    CHECK(images.sizes() == torch::IntArrayRef({3, 4, 5}));
    CHECK(torch::equal(images, expected_images));

    const torch::Tensor read_labels = read_idx_labels(labels_path);
    CHECK(read_labels.scalar_type() == torch::kInt64);
    CHECK(read_labels.sizes() == torch::IntArrayRef({3}));
    CHECK(torch::equal(read_labels, torch::tensor({7, 0, 9}, torch::kInt64)));
  }
}

TEST_CASE("IDX files with no samples give empty tensors", "[mnist][idx]") {
  TempDir dir;
  write_plain(dir.file("images"), idx_bytes(kImageMagic, {0, 28, 28}, {}));
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelMagic, {0}, {}));
  CHECK(read_idx_images(dir.file("images")).sizes() == torch::IntArrayRef({0, 28, 28}));
  CHECK(read_idx_labels(dir.file("labels.gz")).sizes() == torch::IntArrayRef({0}));
}

// The first shape was found by the IDX fuzz harness (docs/RELIABILITY.md): with a zero size the file holds no data,
// and the reader asked LibTorch for an empty tensor whose strides overflow, which threw a c10::Error.
TEST_CASE("IDX dimensions too large for a tensor are an InputError naming the file, with or without data",
          "[mnist][idx]") {
  TempDir dir;
  for (const std::vector<uint32_t>& sizes : std::vector<std::vector<uint32_t>>{
           {0, 0xfeffffe3, 0xffffff1e}, {0xffffffff, 0xffffffff, 0xffffffff}, {1, 0xffffffff, 0xffffffff}}) {
    CAPTURE(sizes);
    const std::string path = dir.file("huge-images");
    write_plain(path, idx_bytes(kImageMagic, sizes, ramp(16)));
    CHECK_THAT(input_error_of([&] { read_idx_images(path); }), Contains(path) && Contains("impossibly large"));
  }
  // Large sizes whose product still fits are only empty when one of them is zero.
  write_plain(dir.file("empty-images"), idx_bytes(kImageMagic, {0, 0x10000, 0x10000}, {}));
  CHECK(read_idx_images(dir.file("empty-images")).sizes() == torch::IntArrayRef({0, 0x10000, 0x10000}));
}

TEST_CASE("the installed Fashion-MNIST test split reads as 10000 images of 28x28 with labels 0..9", "[mnist][idx]") {
  const std::string root = hetseq::test::fashion_mnist_dir();
  const torch::Tensor images = read_idx_images(root + "/t10k-images-idx3-ubyte.gz");
  const torch::Tensor labels = read_idx_labels(root + "/t10k-labels-idx1-ubyte.gz");
  CHECK(images.sizes() == torch::IntArrayRef({10000, 28, 28}));
  CHECK(labels.sizes() == torch::IntArrayRef({10000}));
  CHECK(labels.min().item<int64_t>() == 0);
  CHECK(labels.max().item<int64_t>() == 9);
  // Fashion-MNIST's test split is balanced: 1000 samples per class.
  CHECK(torch::equal(torch::bincount(labels), torch::full({10}, 1000, torch::kInt64)));
  CHECK(images.max().item<int64_t>() == 255);
}

TEST_CASE("an IDX file with a wrong magic number is an InputError naming the file", "[mnist][idx]") {
  TempDir dir;
  for (const bool gzip : {false, true}) {
    CAPTURE(gzip);
    const auto write = gzip ? write_gzip : write_plain;
    const std::string images_path = dir.file(gzip ? "bad-images.gz" : "bad-images");
    write(images_path, idx_bytes(0x12340803, {1, 2, 2}, ramp(4)));
    const std::string message = input_error_of([&] { read_idx_images(images_path); });
    CHECK_THAT(message, Contains(images_path) && Contains("wrong magic number 0x12340803") &&
                            Contains("expected 0x00000803") && Contains("image file"));

    const std::string labels_path = dir.file(gzip ? "bad-labels.gz" : "bad-labels");
    write(labels_path, idx_bytes(0x01000801, {1}, {3}));
    CHECK_THAT(input_error_of([&] { read_idx_labels(labels_path); }),
               Contains(labels_path) && Contains("wrong magic number 0x01000801") && Contains("expected 0x00000801"));
  }
}

TEST_CASE("an IDX file whose elements are not unsigned bytes is an InputError naming the file", "[mnist][idx]") {
  TempDir dir;
  const std::string path = dir.file("float-images");
  write_plain(path, idx_bytes(0x00000D03, {1, 1, 1}, {0, 0, 0, 0}));
  CHECK_THAT(input_error_of([&] { read_idx_images(path); }),
             Contains(path) && Contains("element type 0x0D") && Contains("unsigned bytes"));
}

TEST_CASE("an IDX file with the wrong number of dimensions is an InputError naming the file", "[mnist][idx]") {
  TempDir dir;
  const std::string labels_path = dir.file("train-labels-idx1-ubyte");
  const std::string images_path = dir.file("train-images-idx3-ubyte");
  write_plain(labels_path, idx_bytes(kLabelMagic, {2}, {1, 2}));
  write_plain(images_path, idx_bytes(kImageMagic, {1, 1, 2}, {1, 2}));

  // A label file given as images, and the other way round.
  CHECK_THAT(input_error_of([&] { read_idx_images(labels_path); }),
             Contains(labels_path) && Contains("declares 1 dimensions") && Contains("has 3 [N, rows, cols]"));
  CHECK_THAT(input_error_of([&] { read_idx_labels(images_path); }),
             Contains(images_path) && Contains("declares 3 dimensions") && Contains("has 1 [N]"));
}

TEST_CASE("an IDX file truncated inside its header is an InputError naming the file", "[mnist][idx]") {
  TempDir dir;
  const std::vector<uint8_t> full = idx_bytes(kImageMagic, {2, 2, 2}, ramp(8));
  for (const bool gzip : {false, true}) {
    CAPTURE(gzip);
    const auto write = gzip ? write_gzip : write_plain;

    const std::string empty = dir.file(gzip ? "empty.gz" : "empty");
    write(empty, {});
    CHECK_THAT(input_error_of([&] { read_idx_images(empty); }),
               Contains(empty) && Contains("ends after 0 bytes, inside the IDX header") && Contains("truncated"));

    const std::string in_magic = dir.file(gzip ? "in-magic.gz" : "in-magic");
    write(in_magic, std::vector<uint8_t>(full.begin(), full.begin() + 3));
    CHECK_THAT(input_error_of([&] { read_idx_images(in_magic); }),
               Contains(in_magic) && Contains("ends after 3 bytes"));

    // Magic number and one of the three sizes.
    const std::string in_sizes = dir.file(gzip ? "in-sizes.gz" : "in-sizes");
    write(in_sizes, std::vector<uint8_t>(full.begin(), full.begin() + 8));
    CHECK_THAT(input_error_of([&] { read_idx_images(in_sizes); }),
               Contains(in_sizes) && Contains("ends after 4 of the 12 bytes of IDX dimensions") &&
                   Contains("truncated"));
  }
}

TEST_CASE("an IDX file truncated inside its data is an InputError naming the file", "[mnist][idx]") {
  TempDir dir;
  const std::vector<uint8_t> full = idx_bytes(kImageMagic, {3, 4, 4}, ramp(48));
  for (const bool gzip : {false, true}) {
    CAPTURE(gzip);
    const std::string path = dir.file(gzip ? "short-images.gz" : "short-images");
    (gzip ? write_gzip : write_plain)(path, std::vector<uint8_t>(full.begin(), full.end() - 5));
    CHECK_THAT(input_error_of([&] { read_idx_images(path); }),
               Contains(path) && Contains("ends after 43 of the 48 data bytes") && Contains("[3, 4, 4]") &&
                   Contains("truncated"));
  }

  const std::string labels = dir.file("short-labels");
  write_plain(labels, idx_bytes(kLabelMagic, {10}, {1, 2, 3}));
  CHECK_THAT(input_error_of([&] { read_idx_labels(labels); }),
             Contains(labels) && Contains("ends after 3 of the 10 data bytes"));
}

TEST_CASE("a gzipped IDX file cut inside the compressed stream is an InputError naming the file", "[mnist][idx]") {
  TempDir dir;
  const std::string whole = dir.file("whole.gz");
  std::vector<uint8_t> pixels(64 * 28 * 28);
  std::mt19937 generator(5);
  for (auto& p : pixels) p = static_cast<uint8_t>(generator());
  write_gzip(whole, idx_bytes(kImageMagic, {64, 28, 28}, pixels));
  const std::vector<uint8_t> compressed = read_raw(whole);
  REQUIRE(compressed.size() > 1000);

  const std::string cut = dir.file("cut-images-idx3-ubyte.gz");
  write_plain(cut, std::vector<uint8_t>(compressed.begin(), compressed.begin() + compressed.size() / 2));
  CHECK_THAT(input_error_of([&] { read_idx_images(cut); }),
             Contains(cut) && Contains("corrupt or truncated") && Contains("download the file again"));
}

TEST_CASE("an IDX file with bytes after its data is an InputError naming the file", "[mnist][idx]") {
  TempDir dir;
  std::vector<uint8_t> bytes = idx_bytes(kLabelMagic, {2}, {1, 2});
  bytes.push_back(0);
  for (const bool gzip : {false, true}) {
    CAPTURE(gzip);
    const std::string path = dir.file(gzip ? "long-labels.gz" : "long-labels");
    (gzip ? write_gzip : write_plain)(path, bytes);
    CHECK_THAT(input_error_of([&] { read_idx_labels(path); }),
               Contains(path) && Contains("unexpected bytes after the 2 data bytes"));
  }
}

TEST_CASE("a missing IDX file, or a directory in its place, is an InputError naming the path", "[mnist][idx]") {
  TempDir dir;
  const std::string missing = dir.file("t10k-images-idx3-ubyte.gz");
  CHECK_THAT(input_error_of([&] { read_idx_images(missing); }), Contains(missing) && Contains("no such file"));

  const std::string directory = dir.file("t10k-labels-idx1-ubyte");
  fs::create_directory(directory);
  CHECK_THAT(input_error_of([&] { read_idx_labels(directory); }),
             Contains(directory) && Contains("not a regular file"));
}

TEST_CASE("image and label files with different sample counts are an InputError naming both", "[mnist][idx]") {
  TempDir dir;
  hetseq::mnist::MnistFiles files{dir.file("train-images-idx3-ubyte"), dir.file("train-labels-idx1-ubyte.gz")};
  write_plain(files.images, idx_bytes(kImageMagic, {3, 28, 28}, ramp(3 * 28 * 28)));
  write_gzip(files.labels, idx_bytes(kLabelMagic, {2}, {1, 2}));
  CHECK_THAT(input_error_of([&] { hetseq::mnist::read_mnist_split(files); }),
             Contains(files.images) && Contains("3 images") && Contains(files.labels) && Contains("2 labels"));
}
