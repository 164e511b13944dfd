// Fuzz harness: the IDX reader of the mnist task (tasks/mnist/idx_reader.h) on arbitrary file contents, plain or
// gzipped, read both as an image file and as a label file. See Note [Fuzz harnesses].
#include <torch/types.h>

#include "fuzz/harness.h"
#include "fuzz/scratch_file.h"
#include "hetseq/core/error.h"
#include "tasks/mnist/idx_reader.h"

namespace hetseq::fuzz {
namespace {

/// Checks a tensor a reader returned against the input: a plain (not gzipped) file holds the 4-byte magic number,
/// 4 bytes per dimension, then exactly one byte per element. See Note [IDX format].
void check_read(const torch::Tensor& t, int64_t dims, torch::ScalarType type, const uint8_t* data, size_t size) {
  HETSEQ_ASSERT(t.dim() == dims && t.scalar_type() == type, "the IDX reader returned a {}-d {} tensor, expected {}-d {}",
                t.dim(), c10::toString(t.scalar_type()), dims, c10::toString(type));
  const bool gzipped = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (!gzipped) {
    HETSEQ_ASSERT(size >= 4 && data[0] == 0 && data[1] == 0 && data[2] == 0x08 && data[3] == dims,
                  "the IDX reader accepted a plain file without the magic number of {} dimensions", dims);
    const auto expected = static_cast<int64_t>(size) - 4 - 4 * dims;
    HETSEQ_ASSERT(t.numel() == expected, "the IDX reader returned {} elements from a plain file with {} data bytes",
                  t.numel(), expected);
  }
}

void check_names_file(const Outcome& o, const std::string& path) {
  HETSEQ_ASSERT(o.accepted || o.rejection.find(path) != std::string::npos,
                "the IDX reader's error does not name the file {}: {}", path, o.rejection);
}

}  // namespace

Outcome run_input(const uint8_t* data, size_t size) {
  static ScratchFile file("idx");
  const std::string& path = file.write(data, size);
  const Outcome images = run_expecting<InputError>(
      [&] { check_read(mnist::read_idx_images(path), 3, torch::kUInt8, data, size); });
  const Outcome labels = run_expecting<InputError>(
      [&] { check_read(mnist::read_idx_labels(path), 1, torch::kInt64, data, size); });
  check_names_file(images, path);
  check_names_file(labels, path);
  HETSEQ_ASSERT(!(images.accepted && labels.accepted), "one file read both as IDX images and as IDX labels");
  if (images.accepted || labels.accepted) return images.accepted ? images : labels;
  // Both reasons, so that a known bad input can be held to the one its name is about (fuzz/expected/).
  return Outcome{false, "as images: " + images.rejection + " | as labels: " + labels.rejection};
}

}  // namespace hetseq::fuzz
