// The exit codes as documented: docs/errors.md's table ("Exit codes") row for row against hetseq/core/error.h, and
// every code that README.md and the pages of docs/ state in prose against the kind of failure the sentence names.
#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include <filesystem>

#include <catch2/catch.hpp>

#include "hetseq/core/error.h"
#include "support/test_paths.h"

using namespace hetseq;

namespace {

std::string read_doc(const std::string& relative) {
  std::ifstream in(test::source_dir() + "/" + relative);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The rows "| code | meaning | what to do |" of the table that follows "**Exit codes**", as code -> meaning.
std::map<int, std::string> readme_exit_table(const std::string& readme) {
  const size_t start = readme.find("**Exit codes**");
  REQUIRE(start != std::string::npos);
  std::istringstream lines(readme.substr(start));
  std::string line;
  std::getline(lines, line);  // the heading
  std::map<int, std::string> rows;
  bool in_table = false;
  const std::regex row(R"(^\|\s*(\d+)\s*\|\s*([^|]*?)\s*\|.*\|\s*$)");
  while (std::getline(lines, line)) {
    if (line.rfind("|", 0) != 0) {
      if (in_table) break;  // the first line after the table
      continue;
    }
    in_table = true;
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;  // the header and its rule
    const int code = std::stoi(m[1]);
    INFO(line);
    CHECK(rows.count(code) == 0);
    rows[code] = m[2];
  }
  return rows;
}

// Each exit code that `text` states in prose ("exit code N", "exits with code N"), with its clause: the text
// from the last ';', sentence end or paragraph break before it.
std::vector<std::pair<int, std::string>> stated_exit_codes(const std::string& text) {
  const std::string flat = std::regex_replace(text, std::regex("\n\n"), " | ");
  const std::string joined = std::regex_replace(flat, std::regex("\n"), " ");
  std::vector<std::pair<int, std::string>> out;
  const std::regex stated(R"(exit(?:s with)? code (\d+))");
  for (auto it = std::sregex_iterator(joined.begin(), joined.end(), stated); it != std::sregex_iterator(); ++it) {
    const size_t at = static_cast<size_t>(it->position());
    size_t from = 0;
    for (const char* boundary : {";", ". ", " | "}) {
      const size_t b = joined.rfind(boundary, at);
      if (b != std::string::npos) from = std::max(from, b + std::string(boundary).size());
    }
    out.emplace_back(std::stoi((*it)[1]), joined.substr(from, at + static_cast<size_t>(it->length()) - from));
  }
  return out;
}

// The code that a clause's failure calls for, by what it names; none when it names none of these.
std::optional<int> code_for_clause(const std::string& clause) {
  const std::vector<std::pair<const char*, int>> kinds{
      {"SIGTERM", kExitStopped}, {"SIGINT", kExitStopped},     {"unknown flag", kExitUsage},
      {"malformed", kExitUsage}, {"invalid combination", kExitUsage}, {"file", kExitInput},
      {"shard", kExitInput},     {"corrupt", kExitInput},      {"--save-dir", kExitInput}};
  for (const auto& [word, code] : kinds) {
    if (clause.find(word) != std::string::npos) return code;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("docs/errors.md's exit-code table is the one hetseq/core/error.h defines, row for row", "[docs][exit-codes]") {
  const std::map<int, std::string> table = readme_exit_table(read_doc("docs/errors.md"));
  // What each constant means, as the table's meaning column begins.
  const std::map<int, std::string> expected{{kExitDone, "training finished"},
                                            {kExitInternal, "internal error"},
                                            {kExitUsage, "usage error"},
                                            {kExitInput, "input error"},
                                            {kExitPeerLost, "lost peer or timeout"},
                                            {kExitStopped, "stopped by SIGTERM or SIGINT"}};
  for (const auto& [code, meaning] : expected) {
    INFO("exit code " << code);
    REQUIRE(table.count(code) == 1);
    CHECK(table.at(code).rfind(meaning, 0) == 0);
  }
  for (const auto& [code, meaning] : table) {
    INFO("docs/errors.md row " << code << " | " << meaning);
    CHECK(expected.count(code) == 1);
  }
}

TEST_CASE("README.md and the pages of docs/ state no exit code that contradicts the table", "[docs][exit-codes]") {
  const std::map<int, std::string> table = readme_exit_table(read_doc("docs/errors.md"));
  std::vector<std::string> pages{"README.md"};
  for (const auto& entry : std::filesystem::directory_iterator(hetseq::test::source_dir() + "/docs")) {
    if (entry.path().extension() == ".md") pages.push_back("docs/" + entry.path().filename().string());
  }
  size_t stated = 0;
  for (const std::string& page : pages) {
    for (const auto& [code, clause] : stated_exit_codes(read_doc(page))) {
      INFO(page << ": \"" << clause << "\"");
      ++stated;
      CHECK(table.count(code) == 1);
      if (const auto wanted = code_for_clause(clause)) CHECK(code == *wanted);
      // docs/bert.md states codes only for its input errors (shards, the vocabulary file).
      if (page == "docs/bert.md") CHECK(code == kExitInput);
    }
  }
  CHECK(stated >= 4);  // the prose about flags, files, a stop and a sharded resume
}
