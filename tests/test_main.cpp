// The test binary's entry point. Multi-process tests re-execute this binary as each rank
// (see tests/support/subprocess.h once it lands); everything else is plain Catch2.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
