#include "support/run_output.h"

#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/resume_check.h"

namespace hetseq::test {

std::vector<nlohmann::json> json_lines(const std::string& out, const std::string& tag) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto row = nlohmann::json::parse(line);
    if (row.value("tag", "") == tag) rows.push_back(row);
  }
  return rows;
}

std::string line_with(const std::string& output, const std::string& text) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.find(text) != std::string::npos) return line;
  }
  return "";
}

std::map<int64_t, double> losses_by_update(const std::string& out) {
  std::map<int64_t, double> m;
  for (const auto& row : json_lines(out, "train")) m[row["num_updates"].get<int64_t>()] = row["loss"].get<double>();
  return m;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  INFO(path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

std::optional<std::vector<SampleIdLine>> read_sample_ids(const std::string& dir, int64_t rank) {
  std::ifstream in(dir + "/samples-rank" + std::to_string(rank) + ".txt");
  if (!in.good()) return std::nullopt;
  std::vector<SampleIdLine> lines;
  for (std::string text; std::getline(in, text);) {
    std::istringstream fields(text);
    SampleIdLine line;
    fields >> line.epoch >> line.update;
    for (int64_t id = 0; fields >> id;) line.ids.push_back(id);
    lines.push_back(std::move(line));
  }
  return lines;
}

void check_same_training_state(const Checkpoint& a, const Checkpoint& b) {
  REQUIRE(a.model.size() == b.model.size());
  for (size_t i = 0; i < a.model.size(); ++i) {
    INFO(a.model[i].first);
    CHECK(torch::equal(a.model[i].second, b.model[i].second));
  }
  REQUIRE(a.optimizer_state);
  REQUIRE(b.optimizer_state);
  for (const auto& [name, t] : *a.optimizer_state) {
    INFO(name);
    CHECK(torch::equal(t, b.optimizer_state->at(name)));
  }
  CHECK(state_digest(a) == state_digest(b));
}

}  // namespace hetseq::test
