// The test zygote (Note [Test zygote], support/zygote_server.cpp): ctest's test "test zygote: a forked test has
// the client's directory, environment, output and a session of its own" runs this hidden test through
// hetseq-test-run, with HETSEQ_ZYGOTE_PROBE set to its working directory, and matches the line it prints.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <string>

#include "support/zygote_server.h"

namespace {

int threads_of_this_process() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

}  // namespace

TEST_CASE("zygote probe: a test process forked by the zygote is the one exec would make", "[.][zygote_probe]") {
  REQUIRE(hetseq::test::started_by_zygote());
  const char* probe = std::getenv("HETSEQ_ZYGOTE_PROBE");  // set by ctest for this test alone
  REQUIRE(probe != nullptr);
  char cwd[PATH_MAX];
  REQUIRE(::getcwd(cwd, sizeof(cwd)) != nullptr);
  REQUIRE(std::string(cwd) == probe);
  REQUIRE(::getsid(0) == ::getpid());
  REQUIRE(threads_of_this_process() == 1);
  // On the client's standard output, which ctest reads (its PASS_REGULAR_EXPRESSION).
  std::cout << "zygote probe: forked by the zygote into " << cwd << std::endl;
}
