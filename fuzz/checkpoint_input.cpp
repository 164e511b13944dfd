#include "fuzz/checkpoint_input.h"

#include <sstream>
#include <string_view>

#include <caffe2/serialize/inline_container.h>

namespace hetseq::fuzz {
namespace {

constexpr std::string_view kRecordsHeader = "hetseq-fuzz-records\n";
constexpr std::string_view kRecordSeparator = "\n--record--\n";
constexpr const char* kPickle = "data.pkl";

std::string storage_record(size_t i) { return "data/" + std::to_string(i); }

}  // namespace

std::vector<char> checkpoint_bytes_of_input(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.substr(0, kRecordsHeader.size()) != kRecordsHeader) return std::vector<char>(input.begin(), input.end());
  input.remove_prefix(kRecordsHeader.size());
  std::vector<std::string_view> records;  // [0] the pickle, [1 + i] storage i
  while (true) {
    const size_t end = input.find(kRecordSeparator);
    records.push_back(input.substr(0, end));
    if (end == std::string_view::npos) break;
    input.remove_prefix(end + kRecordSeparator.size());
  }
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t n) {
    archive.insert(archive.end(), static_cast<const char*>(bytes), static_cast<const char*>(bytes) + n);
    return n;
  });
  writer.writeRecord(kPickle, records[0].data(), records[0].size());
  for (size_t i = 1; i < records.size(); ++i) writer.writeRecord(storage_record(i - 1), records[i].data(), records[i].size());
  writer.writeEndOfFile();
  return archive;
}

std::string records_input_of(const std::vector<char>& archive) {
  std::istringstream stream(std::string(archive.begin(), archive.end()));
  caffe2::serialize::PyTorchStreamReader reader(&stream);
  auto record = [&](const std::string& name) {
    const auto [bytes, n] = reader.getRecord(name);
    return std::string(static_cast<const char*>(bytes.get()), n);
  };
  std::string out(kRecordsHeader);
  out += record(kPickle);
  for (size_t i = 0; reader.hasRecord(storage_record(i)); ++i) {
    out += kRecordSeparator;
    out += record(storage_record(i));
  }
  return out;
}

}  // namespace hetseq::fuzz
