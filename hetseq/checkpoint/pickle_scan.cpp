#include "hetseq/checkpoint/pickle_scan.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include "hetseq/core/format.h"

namespace hetseq::detail {
namespace {

/// How an opcode's argument is laid out in the stream (Python's pickletools names the same kinds).
enum class Arg {
  kNone,      // no argument
  kFixed,     // `size` bytes
  kLength,    // a little-endian unsigned length of `size` bytes, then that many bytes
  kLine,      // text up to and including '\n'
  kTwoLines,  // two such lines (GLOBAL, INST)
  kPut,       // a memo index of `size` bytes, or none (MEMOIZE)
  kGet,       // a memo index of `size` bytes
  kUnknown,
};

struct Opcode {
  Arg arg;
  int size;
};

Opcode opcode_of(unsigned char c) {
  switch (c) {
    // No argument.
    case '(': case '.': case '0': case '1': case '2': case 'N': case 0x88: case 0x89: case 'a': case 'e': case 'b':
    case 'd': case '}': case ']': case ')': case 'l': case 'R': case 's': case 'u': case 't': case 0x85: case 0x86:
    case 0x87: case 0x81: case 0x92: case 0x93: case 0x8f: case 0x90: case 0x91: case 'Q': case 'o': case 0x97:
    case 0x98:
      return {Arg::kNone, 0};
    case 0x94: return {Arg::kPut, 0};  // MEMOIZE
    // Fixed-size arguments.
    case 'K': case 0x80: case 0x82: return {Arg::kFixed, 1};  // BININT1, PROTO, EXT1
    case 'M': case 0x83: return {Arg::kFixed, 2};             // BININT2, EXT2
    case 'J': case 0x84: return {Arg::kFixed, 4};             // BININT, EXT4
    case 'G': case 0x95: return {Arg::kFixed, 8};             // BINFLOAT, FRAME
    case 'q': return {Arg::kPut, 1};                          // BINPUT
    case 'r': return {Arg::kPut, 4};                          // LONG_BINPUT
    case 'h': return {Arg::kGet, 1};                          // BINGET
    case 'j': return {Arg::kGet, 4};                          // LONG_BINGET
    // Length-prefixed arguments.
    case 'U': case 'C': case 0x8c: case 0x8a: return {Arg::kLength, 1};  // SHORT_BINSTRING, SHORT_BINBYTES, ...
    case 'T': case 'B': case 'X': case 0x8b: return {Arg::kLength, 4};   // BINSTRING, BINBYTES, BINUNICODE, LONG4
    case 0x8d: case 0x8e: case 0x96: return {Arg::kLength, 8};           // BINUNICODE8, BINBYTES8, BYTEARRAY8
    // Text arguments.
    case 'I': case 'L': case 'F': case 'S': case 'V': case 'P': case 'g': case 'p': return {Arg::kLine, 0};
    case 'c': case 'i': return {Arg::kTwoLines, 0};
    default: return {Arg::kUnknown, 0};
  }
}

uint64_t little_endian(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

std::string describe(unsigned char op, size_t at) {
  return op >= 0x20 && op < 0x7f ? fmt::format("opcode '{}' at byte {}", static_cast<char>(op), at)
                                 : fmt::format("opcode 0x{:02x} at byte {}", op, at);
}

// An archive in memory, for LibTorch's archive reader, without a copy.
class BytesReadAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReadAdapter(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& bytes_;
};

}  // namespace

LoadedArchive load_archive(const std::vector<char>& archive) {
  // One reader and one read of data.pkl for the scan and the unpickler; the unpickling is what torch::pickle_load
  // does (LibTorch's readArchiveAndTensors), with a record reader that notes sizes.
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BytesReadAdapter>(archive));
  // Not a structured binding: C++17 lambdas cannot capture one (clang refuses).
  const std::tuple<at::DataPtr, size_t> pickle = reader.getRecord("data.pkl");
  const char* pickle_bytes = static_cast<const char*>(std::get<0>(pickle).get());
  const size_t pickle_size = std::get<1>(pickle);
  LoadedArchive out;
  out.damage = scan_pickle(std::string_view(pickle_bytes, pickle_size));
  if (!out.damage.empty()) return out;
  size_t consumed = 0;
  auto read_pickle = [&](char* buffer, size_t n) -> size_t {
    n = std::min(n, pickle_size - consumed);
    std::memcpy(buffer, pickle_bytes + consumed, n);
    consumed += n;
    return n;
  };
  auto read_record = [&](const std::string& name) {
    std::tuple<at::DataPtr, size_t> record = reader.getRecord("data/" + name);
    out.record_sizes[std::get<0>(record).get()] = std::get<1>(record);
    return std::move(std::get<0>(record));
  };
  torch::jit::Unpickler unpickler(read_pickle, /*type_resolver=*/nullptr, /*obj_loader=*/nullptr, read_record,
                                  /*device=*/std::nullopt);
  unpickler.set_version(reader.version());
  out.value = unpickler.parse_ivalue();
  return out;
}

std::string scan_pickle(std::string_view pickle) {
  uint64_t memo_entries = 0;
  size_t pos = 0;
  while (pos < pickle.size()) {
    const size_t at = pos;
    const auto op = static_cast<unsigned char>(pickle[pos++]);
    const Opcode code = opcode_of(op);
    const size_t left = pickle.size() - pos;
    auto take = [&](size_t n) -> std::string_view {
      const std::string_view out = pickle.substr(pos, n);
      pos += n;
      return out;
    };
    switch (code.arg) {
      case Arg::kUnknown:
        return fmt::format("{} is not a pickle opcode", describe(op, at));
      case Arg::kNone:
        if (op == '.') {
          return pos == pickle.size() ? "" : fmt::format("{} bytes follow the end of the pickle", pickle.size() - pos);
        }
        break;
      case Arg::kFixed:
        if (left < static_cast<size_t>(code.size)) return fmt::format("{} is cut off", describe(op, at));
        take(static_cast<size_t>(code.size));
        break;
      case Arg::kLength: {
        if (left < static_cast<size_t>(code.size)) return fmt::format("{} is cut off", describe(op, at));
        const uint64_t n = little_endian(take(static_cast<size_t>(code.size)));
        const bool signed_length = op == 'T' || op == 0x8b;  // BINSTRING and LONG4 store an int32
        if ((signed_length && n > 0x7fffffffu) || n > pickle.size() - pos) {
          return fmt::format("{} declares {} bytes, but {} are left", describe(op, at), n, pickle.size() - pos);
        }
        take(static_cast<size_t>(n));
        break;
      }
      case Arg::kLine:
      case Arg::kTwoLines:
        for (int line = 0; line < (code.arg == Arg::kLine ? 1 : 2); ++line) {
          const size_t newline = pickle.find('\n', pos);
          if (newline == std::string_view::npos) return fmt::format("{} has no end of line", describe(op, at));
          pos = newline + 1;
        }
        break;
      case Arg::kPut: {
        if (left < static_cast<size_t>(code.size)) return fmt::format("{} is cut off", describe(op, at));
        const uint64_t index = code.size == 0 ? memo_entries : little_endian(take(static_cast<size_t>(code.size)));
        if (index > memo_entries) {
          return fmt::format("{} stores memo entry {}, but the memo has {} entries", describe(op, at), index,
                             memo_entries);
        }
        if (index == memo_entries) ++memo_entries;
        break;
      }
      case Arg::kGet: {
        if (left < static_cast<size_t>(code.size)) return fmt::format("{} is cut off", describe(op, at));
        const uint64_t index = little_endian(take(static_cast<size_t>(code.size)));
        if (index >= memo_entries) {
          return fmt::format("{} reads memo entry {}, but the memo has {} entries", describe(op, at), index,
                             memo_entries);
        }
        break;
      }
    }
  }
  return "the pickle has no STOP opcode at its end";
}

}  // namespace hetseq::detail
