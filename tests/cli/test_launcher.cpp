// The launcher's worker command lines and the one list of per-rank flags.
#include <catch2/catch.hpp>

#include "hetseq/cli/spawn.h"
#include "hetseq/cli/per_rank_flags.h"

#include <set>
#include <string>

TEST_CASE("Every flag the launcher sets per worker is a per-rank flag", "[launcher]") {
  for (const auto& name : hetseq::launcher_set_flags()) {
    INFO(name);
    CHECK(hetseq::per_rank_flags().count(name) == 1);
  }
}

TEST_CASE("The per-rank flags are the general flags declared per_rank(), and no other", "[launcher]") {
  // What the handshake leaves out of its comparison (Note [Compared flags]): the rank's share, device,
  // threads, identity, paths and logging. (--make-secret never reaches a handshake: it writes a file and exits.)
  const std::set<std::string> expected{
      "max-sentences", "max-sentences-valid", "update-freq", "balance-cap", "device-id", "cpu",
      "distributed-backend", "intra-op-threads", "num-workers", "memory-budget", "distributed-rank",
      "distributed-gpus", "distributed-no-spawn", "distributed-init-method", "distributed-world-size",
      "distributed-timeout", "rendezvous-timeout", "checkpoint-timeout", "data", "save-dir", "restore-file",
      "distributed-secret-file",  // a path, which a node may mount elsewhere; the sealed store checks the secret
      "dump-sample-ids", "trace-dir", "tensorboard-logdir", "json-log", "user-dir", "log-format", "log-interval",
      "no-progress-bar", "log-all-ranks", "trace-ops", "help"};
  CHECK(hetseq::per_rank_flags() == expected);
  for (const char* compared : {"lr", "zero-sharding", "clip-norm", "seed", "max-update", "bucket-cap-mb"}) {
    INFO(compared);
    CHECK(hetseq::per_rank_flags().count(compared) == 0);
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
