// Replays inputs through a harness without libFuzzer: the fuzz_replay_<harness> ctests of the normal build, and
// reproducing a crash file with a gcc build. See Note [Fuzz harnesses].
//
//   hetseq-fuzz-<harness> [--expect FILE] PATH...
//       each PATH a file or a directory (its files, in name order, not recursive)
//       FILE: lines "NAME<TAB>TEXT": the input NAME must be rejected with a reason containing TEXT
//
// Exits 1 when an input escapes with an unexpected exception (a finding), a seed named valid-* is rejected, an input
// named bad-*, crash-* or oom-* (a known bad input) is accepted, or with --expect, a known bad input has no line in
// FILE or is rejected for another reason than its line says, after replaying the rest; a crash ends the process at
// once, and the last "replaying" line names the input.
// HETSEQ_FUZZ_VERBOSE=1 also prints why each input was rejected.
#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fuzz/harness.h"

namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<fs::path> inputs_of(const std::string& arg) {
  std::vector<fs::path> out;
  if (fs::is_directory(arg)) {
    for (const auto& entry : fs::directory_iterator(arg)) {
      if (entry.is_regular_file()) out.push_back(entry.path());
    }
    std::sort(out.begin(), out.end());
  } else if (fs::is_regular_file(arg)) {
    out.emplace_back(arg);
  } else {
    throw std::runtime_error(arg + ": no such file or directory");
  }
  return out;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// NAME<TAB>TEXT lines; '#' starts a comment line.
std::map<std::string, std::string> read_expectations(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("--expect " + path + ": cannot open it");
  std::map<std::string, std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto tab = line.find('\t');
    if (tab == std::string::npos || tab == 0 || tab + 1 == line.size()) {
      throw std::runtime_error("--expect " + path + ": expected NAME<TAB>TEXT, got: " + line);
    }
    out[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return out;
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " FILE_OR_DIR...   (replays inputs through the harness)\n";
    return 2;
  }
  const bool verbose = std::getenv("HETSEQ_FUZZ_VERBOSE") != nullptr;
  int first = 1;
  std::optional<std::map<std::string, std::string>> expected;  // [input name] text its rejection must contain
  if (std::string(argv[1]) == "--expect") {
    if (argc < 4) {
      std::cerr << "usage: " << argv[0] << " [--expect FILE] FILE_OR_DIR...\n";
      return 2;
    }
    try {
      expected = read_expectations(argv[2]);
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << "\n";
      return 2;
    }
    first = 3;
  }
  int accepted = 0, rejected = 0, failed = 0;
  for (int a = first; a < argc; ++a) {
    std::vector<fs::path> inputs;
    try {
      inputs = inputs_of(argv[a]);
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << "\n";
      return 2;
    }
    if (inputs.empty()) {
      std::cerr << "error: " << argv[a] << ": no inputs (an empty corpus replays nothing)\n";
      return 2;
    }
    for (const fs::path& path : inputs) {
      std::cerr << "replaying " << path.string() << std::endl;
      const std::vector<uint8_t> bytes = read_bytes(path);
      const std::string name = path.filename().string();
      const bool known_bad = starts_with(name, "bad-") || starts_with(name, "crash-") || starts_with(name, "oom-");
      try {
        const hetseq::fuzz::Outcome outcome = hetseq::fuzz::run_input(bytes.data(), bytes.size());
        if (outcome.accepted && known_bad) {
          ++failed;
          std::cerr << "FAILED " << path.string() << ": a known bad input was accepted\n";
        } else if (outcome.accepted) {
          ++accepted;
        } else if (known_bad && expected && !expected->count(name)) {
          ++failed;
          std::cerr << "FAILED " << path.string() << ": no line for it in --expect; it was rejected with: "
                    << outcome.rejection << "\n";
        } else if (known_bad && expected && outcome.rejection.find(expected->at(name)) == std::string::npos) {
          ++failed;
          std::cerr << "FAILED " << path.string() << ": rejected for another reason than expected\n  expected: "
                    << expected->at(name) << "\n  got: " << outcome.rejection << "\n";
        } else if (starts_with(name, "valid-")) {
          ++failed;
          std::cerr << "FAILED " << path.string() << ": a valid-* seed was rejected: " << outcome.rejection
                    << "\n  (regenerate the seeds with hetseq-fuzz-seeds, see docs/RELIABILITY.md)\n";
        } else {
          ++rejected;
          if (verbose) std::cerr << "  rejected: " << outcome.rejection << "\n";
        }
      } catch (const std::exception& e) {
        ++failed;
        std::cerr << "FINDING " << path.string() << ": unexpected exception: " << e.what() << "\n";
      }
    }
  }
  std::cout << argv[0] << ": " << accepted + rejected + failed << " inputs: " << accepted << " accepted, " << rejected
            << " rejected, " << failed << " failed" << std::endl;
  return failed == 0 ? 0 : 1;
}
