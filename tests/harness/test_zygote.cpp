// The test zygote (Note [Test zygote], support/zygote_server.cpp): ctest's test "test zygote: a forked test has
// the client's directory, environment, output and a session of its own" runs this hidden test through
// hetseq-test-run, with HETSEQ_ZYGOTE_PROBE set to its working directory, and matches the line it prints.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <string>

#include "hetseq/world/launcher.h"
#include "support/zygote_server.h"

TEST_CASE("zygote probe: a test process forked by the zygote is the one exec would make", "[.][zygote_probe]") {
  REQUIRE(hetseq::test::started_by_zygote());
  const char* probe = std::getenv("HETSEQ_ZYGOTE_PROBE");  // set by ctest for this test alone
  REQUIRE(probe != nullptr);
  char cwd[PATH_MAX];
  REQUIRE(::getcwd(cwd, sizeof(cwd)) != nullptr);
  REQUIRE(std::string(cwd) == probe);
  REQUIRE(::getsid(0) == ::getpid());
  REQUIRE(hetseq::fork_is_safe_here());  // one thread: the test may fork programs
  // On the client's standard output, which ctest reads (its PASS_REGULAR_EXPRESSION).
  std::cout << "zygote probe: forked by the zygote into " << cwd << std::endl;
}
