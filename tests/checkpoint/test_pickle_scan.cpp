// The framing check of a checkpoint's pickle before LibTorch unpickles it (Note [Pickle scan]): hand-made pickles,
// the pickle of a real checkpoint, and a checkpoint whose pickle declares a string of 1 GB.
#include <sstream>
#include <string>
#include <vector>

#include <caffe2/serialize/inline_container.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/checkpoint/pickle_scan.h"
#include "support/error_message.h"

using Catch::Contains;
using hetseq::detail::scan_pickle;
using hetseq::test::input_error_of;

namespace {

// A pickle from its bytes, written as a string literal with its length (the literals hold NUL bytes).
template <size_t N>
std::string pickle(const char (&bytes)[N]) {
  return std::string(bytes, N - 1);
}

hetseq::Checkpoint small_checkpoint() {
  hetseq::Checkpoint c;
  c.model = {{"fc.weight", torch::arange(6, torch::kFloat32).reshape({2, 3})}};
  c.optimizer_name = "sgd";
  c.rng_state = torch::arange(16, torch::kUInt8);
  c.task = "mnist";
  return c;
}

// The records of a checkpoint archive: the pickle (data.pkl) and the tensors' storages (data/0, data/1, ...).
struct Records {
  std::string pickle;
  std::vector<std::string> storages;
};

Records records_of(const std::vector<char>& archive) {
  std::istringstream stream(std::string(archive.begin(), archive.end()));
  caffe2::serialize::PyTorchStreamReader reader(&stream);
  auto record = [&](const std::string& name) {
    const auto [bytes, n] = reader.getRecord(name);
    return std::string(static_cast<const char*>(bytes.get()), n);
  };
  Records r{record("data.pkl"), {}};
  for (size_t i = 0; reader.hasRecord("data/" + std::to_string(i)); ++i) {
    r.storages.push_back(record("data/" + std::to_string(i)));
  }
  return r;
}

std::vector<char> archive_of(const Records& r) {
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t n) {
    archive.insert(archive.end(), static_cast<const char*>(bytes), static_cast<const char*>(bytes) + n);
    return n;
  });
  writer.writeRecord("data.pkl", r.pickle.data(), r.pickle.size());
  for (size_t i = 0; i < r.storages.size(); ++i) {
    writer.writeRecord("data/" + std::to_string(i), r.storages[i].data(), r.storages[i].size());
  }
  writer.writeEndOfFile();
  return archive;
}

}  // namespace

TEST_CASE("pickles with sound framing pass the scan", "[checkpoint][pickle]") {
  // PROTO 2, EMPTY_DICT, BINPUT 0, BINUNICODE "a", BININT1 1, SETITEM, BINGET 0, POP, STOP
  CHECK(scan_pickle(pickle("\x80\x02}q\x00X\x01\x00\x00\x00" "aK\x01sh\x00" "0.")).empty());
  // PROTO 4, FRAME, EMPTY_LIST, MEMOIZE, GLOBAL "torch FloatStorage", MEMOIZE, STOP
  CHECK(scan_pickle(pickle("\x80\x04\x95\x18\x00\x00\x00\x00\x00\x00\x00]\x94" "ctorch\nFloatStorage\n\x94.")).empty());
  // The pickle of a real checkpoint.
  CHECK(scan_pickle(records_of(hetseq::encode_checkpoint(small_checkpoint())).pickle).empty());
}

TEST_CASE("damaged pickle framing is named with its opcode and byte", "[checkpoint][pickle]") {
  CHECK(scan_pickle(pickle("\x80\x02X\x00\x00\x00\x40" "ab.")) ==
        "opcode 'X' at byte 2 declares 1073741824 bytes, but 3 are left");
  CHECK(scan_pickle(pickle("\x80\x02T\xff\xff\xff\xff.")) ==
        "opcode 'T' at byte 2 declares 4294967295 bytes, but 1 are left");
  CHECK(scan_pickle(pickle("\x80\x02}r\xff\xff\xff\x00.")) ==
        "opcode 'r' at byte 3 stores memo entry 16777215, but the memo has 0 entries");
  CHECK(scan_pickle(pickle("\x80\x02}h\x05.")) == "opcode 'h' at byte 3 reads memo entry 5, but the memo has 0 entries");
  CHECK(scan_pickle(pickle("\x80\x02\xff.")) == "opcode 0xff at byte 2 is not a pickle opcode");
  CHECK(scan_pickle(pickle("\x80\x02J\x01\x00")) == "opcode 'J' at byte 2 is cut off");
  CHECK(scan_pickle(pickle("\x80\x02" "ctorch\nFloatStorage")) == "opcode 'c' at byte 2 has no end of line");
  CHECK(scan_pickle(pickle("\x80\x02}")) == "the pickle has no STOP opcode at its end");
  CHECK(scan_pickle(pickle("\x80\x02}.x")) == "1 bytes follow the end of the pickle");
  CHECK(scan_pickle("") == "the pickle has no STOP opcode at its end");
}

// Found by the checkpoint fuzz harness (docs/RELIABILITY.md, Fuzzing): one changed byte in a string's length made
// LibTorch's unpickler allocate and zero 1 GB before it noticed that the pickle ends a few bytes later.
TEST_CASE("a checkpoint whose pickle declares a 1 GB string is a clear error naming the file", "[checkpoint][pickle]") {
  Records records = records_of(hetseq::encode_checkpoint(small_checkpoint()));
  const std::string key = pickle("X\x0e\x00\x00\x00" "format_version");
  const size_t at = records.pickle.find(key);
  REQUIRE(at != std::string::npos);
  records.pickle.replace(at + 1, 4, pickle("\x00\x00\x00\x40"));
  const std::string message = input_error_of([&] { hetseq::decode_checkpoint(archive_of(records), "huge-string.pt"); });
  CHECK_THAT(message, Contains("huge-string.pt") && Contains("its pickle (data.pkl) is damaged") &&
                          Contains("declares 1073741824 bytes"));
}
