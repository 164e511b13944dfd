#pragma once
// Small helpers of the level-2 tests that run hetseq-train: a command line, extending one, and requiring
// that a run succeeded (with its stderr in the failure message).

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/subprocess.h"

namespace hetseq::test {

/// hetseq-train on the MNIST IDX files in `data` with deterministic CPU work (Adam, one intra-op thread, no loader
/// threads), a JSON log line per update and checkpoints in `save_dir`; the tests add the world and the schedule.
inline std::vector<std::string> mnist_train_args(const std::string& data, const std::string& save_dir,
                                                 int seed = 11) {
  return {binary_path("hetseq-train"), "--task", "mnist", "--data", data, "--cpu", "--optimizer", "adam", "--lr",
          "0.001", "--num-workers", "0", "--intra-op-threads", "1", "--no-progress-bar", "--log-format", "json",
          "--log-interval", "1", "--save-dir", save_dir, "--distributed-timeout", "60", "--seed",
          std::to_string(seed)};
}

/// hetseq-train on the MNIST IDX files in `data` as the balancing tests run it: no dropout, SGD with momentum,
/// deterministic CPU work, no validation, a JSON log line per update, checkpoints in `save_dir`.
inline std::vector<std::string> balance_train_args(const std::string& data, const std::string& save_dir) {
  return {binary_path("hetseq-train"), "--task", "mnist", "--data", data, "--cpu", "--dropout", "0,0",
          "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--disable-validation", "--num-workers", "0",
          "--intra-op-threads", "1", "--no-progress-bar", "--log-format", "json", "--log-interval", "1",
          "--save-dir", save_dir, "--distributed-timeout", "60", "--seed", "5"};
}

/// `args` followed by `more`.
inline std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

/// Requires that `r` finished in time with exit code 0; `who` names the run in the failure.
inline void require_success(const ProcessResult& r, const std::string& who) {
  INFO(who << " stderr:\n" << r.err);
  REQUIRE(!r.timed_out);
  REQUIRE(r.exit_code == 0);
}

/// require_success for every rank of a run, [rank]; the failure names `who` and the rank.
inline void require_all(const std::vector<ProcessResult>& ranks, const std::string& who) {
  for (size_t r = 0; r < ranks.size(); ++r) require_success(ranks[r], who + ": rank " + std::to_string(r));
}

}  // namespace hetseq::test
