#include "tasks/mnist/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq::mnist {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;  // the IDX element type code of uint8

/// What a reader expects of a file. See Note [IDX format].
struct IdxKind {
  int ndims;
  const char* name;    // "image" or "label"
  const char* layout;  // the dimensions, for messages
};

constexpr IdxKind kImages{3, "image", "[N, rows, cols]"};
constexpr IdxKind kLabels{1, "label", "[N]"};

uint32_t magic_of(const IdxKind& kind) { return (uint32_t{kUnsignedByte} << 8) | static_cast<uint32_t>(kind.ndims); }

uint32_t big_endian_u32(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) | uint32_t{bytes[3]};
}

/// A file opened with zlib, which reads gzipped and plain files alike; closes on destruction.
class CompressedFile {
 public:
  explicit CompressedFile(const std::string& path) : path_(path) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(status)) {
      throw InputError(fmt::format("{}: no such file; check --data or download the MNIST/Fashion-MNIST files", path));
    }
    if (!std::filesystem::is_regular_file(status)) {
      throw InputError(fmt::format("{}: not a regular file; expected an IDX file (optionally gzipped)", path));
    }
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      throw InputError(fmt::format("{}: cannot open ({}); check its permissions", path,
                                   errno != 0 ? std::strerror(errno) : "out of memory"));
    }
    gzbuffer(file_, 1 << 17);
  }
  ~CompressedFile() { gzclose(file_); }
  CompressedFile(const CompressedFile&) = delete;
  CompressedFile& operator=(const CompressedFile&) = delete;

  /// Reads up to `n` bytes into `dst`; returns how many were read (fewer only at the end of the file).
  /// Throws hetseq::InputError when the gzip data is corrupt or ends inside the compressed stream.
  size_t read(uint8_t* dst, size_t n) {
    size_t total = 0;
    while (total < n) {
      const auto chunk = static_cast<unsigned>(std::min<size_t>(n - total, size_t{1} << 30));
      const int got = gzread(file_, dst + total, chunk);
      int err = Z_OK;
      const char* message = gzerror(file_, &err);
      if (got < 0 || err != Z_OK) {
        throw InputError(fmt::format("{}: the gzip data is corrupt or truncated ({}); download the file again",
                                     path_, message));
      }
      if (got == 0) break;
      total += static_cast<size_t>(got);
    }
    return total;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

/// Reads a whole IDX file of uint8 elements with `kind.ndims` dimensions. See Note [IDX format].
torch::Tensor read_idx(const std::string& path, const IdxKind& kind) {
  CompressedFile file(path);

  uint8_t magic_bytes[4];
  const size_t magic_read = file.read(magic_bytes, sizeof magic_bytes);
  if (magic_read < sizeof magic_bytes) {
    throw InputError(fmt::format("{}: the file ends after {} bytes, inside the IDX header; the file is empty or "
                                 "truncated, download it again",
                                 path, magic_read));
  }
  const uint32_t magic = big_endian_u32(magic_bytes);
  if (magic_bytes[0] != 0 || magic_bytes[1] != 0) {
    throw InputError(fmt::format("{}: wrong magic number 0x{:08X} (expected 0x{:08X} for an IDX {} file); is this an "
                                 "MNIST {} file?",
                                 path, magic, magic_of(kind), kind.name, kind.name));
  }
  if (magic_bytes[2] != kUnsignedByte) {
    throw InputError(fmt::format("{}: magic number 0x{:08X} declares IDX element type 0x{:02X}, but MNIST files hold "
                                 "unsigned bytes (0x08, magic 0x{:08X}); is this an MNIST {} file?",
                                 path, magic, magic_bytes[2], magic_of(kind), kind.name));
  }
  if (magic_bytes[3] != kind.ndims) {
    throw InputError(fmt::format("{}: magic number 0x{:08X} declares {} dimensions, but an IDX {} file has {} {} "
                                 "(magic 0x{:08X}); is this an MNIST {} file?",
                                 path, magic, magic_bytes[3], kind.name, kind.ndims, kind.layout, magic_of(kind),
                                 kind.name));
  }

  std::vector<uint8_t> size_bytes(4 * static_cast<size_t>(kind.ndims));
  const size_t sizes_read = file.read(size_bytes.data(), size_bytes.size());
  if (sizes_read < size_bytes.size()) {
    throw InputError(fmt::format("{}: the file ends after {} of the {} bytes of IDX dimensions {}; the file is "
                                 "truncated, download it again",
                                 path, sizes_read, size_bytes.size(), kind.layout));
  }
  std::vector<int64_t> sizes;  // [dimension]
  // The product of the non-zero sizes must fit a tensor's strides even when a zero size makes the file empty:
  // [0, 4294967295, 4294967295] holds no data, but is no tensor shape either (found by fuzzing, see
  // docs/RELIABILITY.md).
  uint64_t extent = 1;
  bool empty = false;
  for (int d = 0; d < kind.ndims; ++d) {
    const uint32_t size = big_endian_u32(size_bytes.data() + 4 * d);
    sizes.push_back(size);
    empty = empty || size == 0;
    if (__builtin_mul_overflow(extent, uint64_t{std::max<uint32_t>(size, 1)}, &extent) ||
        extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw InputError(fmt::format("{}: the IDX dimensions {} = [{}] are impossibly large; the header is corrupt, "
                                   "download the file again",
                                   path, kind.layout, fmt::join(sizes, ", ")));
    }
  }
  const uint64_t total = empty ? 0 : extent;

  // Read in chunks rather than allocating what a corrupt header claims up front.
  constexpr size_t kChunkBytes = size_t{1} << 22;
  std::vector<uint8_t> data;
  while (data.size() < total) {
    const size_t want = std::min<size_t>(total - data.size(), kChunkBytes);
    const size_t offset = data.size();
    data.resize(offset + want);
    const size_t got = file.read(data.data() + offset, want);
    if (got < want) {
      throw InputError(fmt::format("{}: the file ends after {} of the {} data bytes that its header declares ({} = "
                                   "[{}]); the file is truncated, download it again",
                                   path, offset + got, total, kind.layout, fmt::join(sizes, ", ")));
    }
  }
  uint8_t extra = 0;
  if (file.read(&extra, 1) != 0) {
    throw InputError(fmt::format("{}: unexpected bytes after the {} data bytes that its header declares ({} = [{}]); "
                                 "the file is corrupt, download it again",
                                 path, total, kind.layout, fmt::join(sizes, ", ")));
  }

  torch::Tensor out = torch::empty(sizes, torch::kUInt8);
  if (total > 0) std::memcpy(out.data_ptr<uint8_t>(), data.data(), total);
  return out;
}

}  // namespace

torch::Tensor read_idx_images(const std::string& path) { return read_idx(path, kImages); }

torch::Tensor read_idx_labels(const std::string& path) { return read_idx(path, kLabels).to(torch::kInt64); }

}  // namespace hetseq::mnist
