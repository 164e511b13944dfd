// The test suite's own process runner (tests/support/subprocess.h): a multi-rank failure must fail the
// test in seconds, not wait out the whole deadline.
#include <catch2/catch.hpp>

#include "support/subprocess.h"

using namespace hetseq::test;
using namespace std::chrono_literals;

TEST_CASE("run_processes: once one process fails, the others get the grace period and are then killed",
          "[support][subprocess]") {
  const auto start = std::chrono::steady_clock::now();
  const auto results = run_processes({{"/bin/sh", "-c", "sleep 0.2; echo failing >&2; exit 3"},
                                      {"/bin/sh", "-c", "echo waiting; exec sleep 600"}},
                                     300s, {}, 2s);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 30s);  // the grace, not the 300 s deadline
  CHECK(took >= 2s);
  REQUIRE(results.size() == 2);
  CHECK(results[0].exit_code == 3);
  CHECK(!results[0].timed_out);
  CHECK(results[0].err == "failing\n");
  CHECK(results[1].timed_out);
  CHECK(results[1].exit_code == 128 + 9);  // SIGKILL
  CHECK(results[1].out == "waiting\n");
}

TEST_CASE("run_processes: processes that all succeed are waited for, however long the grace", "[support][subprocess]") {
  const auto results = run_processes({{"/bin/sh", "-c", "exit 0"}, {"/bin/sh", "-c", "sleep 1; echo done"}}, 60s, {}, 0s);
  REQUIRE(results.size() == 2);
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
  CHECK(!results[1].timed_out);
  CHECK(results[1].out == "done\n");
}
