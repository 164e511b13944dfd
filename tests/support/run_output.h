#pragma once
// Reading what a hetseq-train run left behind, for the level-2 tests: its JSON log lines, its
// --dump-sample-ids files, and the comparison of two checkpoints' training state.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hetseq/checkpoint/checkpoint.h"

namespace hetseq::test {

/// The JSON lines of a run's stdout whose `tag` is `tag` (`train`, `valid`, `train_epoch`).
std::vector<nlohmann::json> json_lines(const std::string& out, const std::string& tag);

/// The first line of `output` (a run's stderr or stdout) that holds `text`, without its newline; "" when none does.
std::string line_with(const std::string& output, const std::string& text);

/// The training loss of every logged update (`train` lines), by update number.
std::map<int64_t, double> losses_by_update(const std::string& out);

/// The JSON document in the file at `path` (a trace); a Catch failure when it cannot be read.
nlohmann::json read_json_file(const std::string& path);

/// One line of a --dump-sample-ids file: `EPOCH UPDATE ID ID ...` (see hetseq::SampleIdLog).
struct SampleIdLine {
  int64_t epoch = 0;
  int64_t update = 0;
  std::vector<int64_t> ids;
};

/// Rank `rank`'s lines of the dump in `dir`; nullopt when the rank wrote no file.
std::optional<std::vector<SampleIdLine>> read_sample_ids(const std::string& dir, int64_t rank);

/// Checks (Catch CHECKs, naming the entry) that two checkpoints hold bit-identical parameters and
/// optimizer state and the same state digest.
void check_same_training_state(const Checkpoint& a, const Checkpoint& b);

}  // namespace hetseq::test
