#pragma once
// Small helpers of the level-2 tests that run hetseq-train: extending a command line, and requiring
// that a run succeeded (with its stderr in the failure message).

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/subprocess.h"

namespace hetseq::test {

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

}  // namespace hetseq::test
