#include "hetseq/observe/trace_merge.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

json read_trace(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw InputError(fmt::format("{}: cannot read this trace file", file));
  json doc;
  try {
    in >> doc;
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not a JSON trace ({}); was it cut short while being written?", file, e.what()));
  }
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array() ||
      !doc.contains("otherData") || !doc["otherData"].contains("rank")) {
    throw InputError(fmt::format("{}: not a hetseq trace (no traceEvents or otherData.rank); write one with "
                                 "hetseq-train --trace-dir",
                                 file));
  }
  return doc;
}

}  // namespace

std::vector<std::string> find_trace_files(const std::vector<std::string>& args) {
  static const std::regex name(R"(trace_rank\d+\.json)");
  std::vector<std::string> files;
  for (const auto& a : args) {
    if (fs::is_directory(a)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(a)) {
        if (e.is_regular_file() && std::regex_match(e.path().filename().string(), name)) found.push_back(e.path());
      }
      if (found.empty()) throw InputError(fmt::format("{}: no trace_rank<R>.json files in this directory", a));
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(a)) {
      files.push_back(a);
    } else {
      throw InputError(fmt::format("{}: no such trace file or directory", a));
    }
  }
  return files;
}

size_t merge_traces(const std::vector<std::string>& files, const std::string& out) {
  if (files.empty()) throw UsageError("hetseq-trace merge: no trace files given");
  json events = json::array();
  std::map<int64_t, std::string> rank_file;  // [rank] the file it came from
  json ranks = json::array();
  std::string first;
  int64_t run_zero = 0;  // rank 0's system clock at time zero, as the first file says
  for (const auto& file : files) {
    json doc = read_trace(file);
    const json& other = doc["otherData"];
    const int64_t rank = other["rank"].get<int64_t>();
    if (auto [it, fresh] = rank_file.emplace(rank, file); !fresh) {
      throw InputError(fmt::format("{} and {} both hold rank {}: merge the traces of one run", it->second, file, rank));
    }
    // Time zero is one instant on every rank of a run (Note [Tracing]); a rank's system clock then
    // read rank 0's plus its measured offset.
    int64_t zero = other.value("time_zero_system_us", int64_t{0});
    const json offsets = other.value("clock_offsets_us", json::array());
    if (offsets.is_array() && static_cast<size_t>(rank) < offsets.size()) zero -= offsets[rank].get<int64_t>();
    if (first.empty()) {
      first = file;
      run_zero = zero;
    } else if (std::llabs(zero - run_zero) > 1'000'000) {
      throw InputError(fmt::format("{} and {} come from different runs (their time zeros are {:.1f} s apart); "
                                   "merge the traces of one run",
                                   first, file, static_cast<double>(zero - run_zero) / 1e6));
    }
    for (auto& e : doc["traceEvents"]) events.push_back(std::move(e));
    ranks.push_back(doc["otherData"]);
  }
  std::stable_sort(events.begin(), events.end(), [](const json& a, const json& b) {
    const bool ma = a.value("ph", "") == "M", mb = b.value("ph", "") == "M";
    if (ma != mb) return ma;  // metadata first
    return a.value("ts", int64_t{0}) < b.value("ts", int64_t{0});
  });
  json doc;
  const size_t n = events.size();
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ms";
  doc["otherData"] = {{"producer", "hetseq-trace merge"}, {"ranks", ranks}};
  const std::string text = doc.dump();
  write_file_atomically(out, std::vector<char>(text.begin(), text.end()), "the output directory (-o)");
  return n;
}

}  // namespace hetseq
