// The launcher's worker command lines and the one list of per-rank flags.
#include <catch2/catch.hpp>

#include "hetseq/cli/spawn.h"
#include "hetseq/cli/per_rank_flags.h"

TEST_CASE("Every flag the launcher sets per worker is a per-rank flag", "[launcher]") {
  for (const auto& name : hetseq::launcher_set_flags()) {
    INFO(name);
    CHECK(hetseq::per_rank_flags().count(name) == 1);
  }
}

TEST_CASE("A worker's command line replaces the launcher's flags and keeps every other flag", "[launcher]") {
  hetseq::cli::WorkerLaunchOptions o;
  o.argv = {"hetseq-train", "--task", "mnist", "--max-sentences", "32,16", "--distributed-gpus", "2",
            "--distributed-rank=4", "--dropout", "0.1,0.2", "--distributed-no-spawn", "--cpu"};
  o.first_rank = 4;
  o.world_size = 6;
  o.batch_sizes = {32, 16};
  const auto args = hetseq::cli::worker_command_line(o, 1, "tcp://127.0.0.1:1234");
  const std::vector<std::string> expected{
      "hetseq-train", "--task", "mnist", "--distributed-gpus", "2", "--dropout", "0.1,0.2", "--cpu",
      "--distributed-no-spawn", "--distributed-world-size", "6", "--distributed-rank", "5", "--device-id", "1",
      "--max-sentences", "16", "--distributed-init-method", "tcp://127.0.0.1:1234"};
  CHECK(args == expected);
}
