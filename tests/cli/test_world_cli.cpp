// How hetseq-train forms its world, as a user meets it: the default world size of a node's workers,
// ranks that disagree on a flag stopped at start with the flag, two ranks and their two values, and
// workers forked by the launcher training as workers started anew.
#include <catch2/catch.hpp>

#include "hetseq/core/error.h"
#include "hetseq/world/launcher.h"
#include "support/mnist_files.h"
#include "support/run_output.h"
#include "support/subprocess.h"

using namespace hetseq::test;
using namespace std::chrono_literals;

namespace {

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("A node started with only --distributed-gpus 2 --cpu trains one model on a world of 2 ranks", "[cli][world][installed-data]") {
  TempDir dir;
  const auto r = run_process({binary_path("hetseq-train"), "--task", "mnist", "--cpu", "--distributed-gpus", "2",
                              "--max-sentences", "32", "--max-update", "3", "--disable-validation", "--log-format",
                              "json", "--log-interval", "1", "--save-dir", dir / "save"},
                             300s);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // One world: 2 x 32 samples per update over all 60000, logged once (by rank 0).
  CHECK(count_of(r.err, "60000 training samples, 64 samples per update over 2 rank(s), 938 updates per epoch") == 1);
  CHECK(count_of(r.err, "[rendezvous] rank 0 of 2 joined") == 1);
  CHECK(count_of(r.err, "of 1 joined") == 0);
  CHECK(count_of(r.out, "\"tag\":\"train\"") == 3);
  CHECK(count_of(r.out, "\"bsz\":64") == 4);  // 3 train lines and the train_epoch line
  CHECK(count_of(r.err, "[checkpoint] saved checkpoint_last.pt") == 1);
}

TEST_CASE("ranks that differ in a compared flag or in their data stop at start and the error names it", "[cli][world][installed-data]") {
  struct Case {
    std::string name;
    std::vector<std::string> rank1;  // extra flags of rank 1
    std::string message;
  };
  TempDir small;
  write_random_mnist(small.path(), 200, 20);
  const std::vector<Case> cases{
      {"a task flag", {"--dropout", "0.1,0.5"}, "disagree on --dropout: rank 0 has '0.25,0.5', rank 1 has '0.1,0.5'"},
      {"--min-lr", {"--min-lr", "0.001"}, "disagree on --min-lr: rank 0 has '-1', rank 1 has '0.001'"},
      {"--momentum", {"--momentum", "0.9"}, "disagree on --momentum: rank 0 has '0', rank 1 has '0.9'"},
      {"the data", {"--data", small.path()},
       "disagree on size of the training split 'train' (from --data): rank 0 has '60000', rank 1 has '200'"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      TempDir dir;
      std::vector<std::vector<std::string>> commands;
      for (int r = 0; r < 2; ++r) {
        std::vector<std::string> args{binary_path("hetseq-train"), "--task", "mnist", "--cpu", "--optimizer", "sgd",
                                      "--max-sentences", "16", "--max-update", "2", "--no-save",
                                      "--distributed-world-size", "2", "--distributed-rank", std::to_string(r),
                                      "--distributed-init-method", "file://" + (dir / "rendezvous"),
                                      "--distributed-timeout", "60"};
        if (r == 1) args.insert(args.end(), c.rank1.begin(), c.rank1.end());
        commands.push_back(args);
      }
      const auto results = run_processes(commands, 120s);
      for (int r = 0; r < 2; ++r) {
        INFO("rank " << r << " stderr:\n" << results[r].err);
        CHECK(results[r].exit_code == hetseq::kExitInput);
        CHECK_THAT(results[r].err, Catch::Contains(c.message));
        CHECK_THAT(results[r].err, !Catch::Contains("[train] done"));
      }
    }
  }
}

// Note [Forked workers] (hetseq/world/launcher.cpp): on CPUs the launcher forks its workers, which run
// hetseq-train's entry point on the command line that a worker started anew gets. The two starts must
// train alike; HETSEQ_WORKER_START=exec asks for the start anew.
TEST_CASE("workers forked by the launcher train exactly as workers started anew, and the log says which start", "[cli][world]") {
  TempDir data;
  write_random_mnist(data.path(), 300, 20);
  std::map<std::string, std::map<int64_t, double>> losses;
  for (const std::string start : {"fork", "exec"}) {
    TempDir dir;
    std::map<std::string, std::string> env;
    if (start == "exec") env[hetseq::kWorkerStartEnv] = "exec";
    const auto r = run_process({binary_path("hetseq-train"), "--task", "mnist", "--data", data.path(), "--cpu",
                                "--distributed-gpus", "3", "--max-sentences", "7,13,29", "--optimizer", "adam",
                                "--lr", "0.01", "--max-update", "4", "--disable-validation", "--no-save",
                                "--log-format", "json", "--log-interval", "1", "--intra-op-threads", "1"},
                               120s, env);
    INFO(start << " stderr:\n" << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(count_of(r.err, start == "fork" ? "[launcher] started 3 workers, ranks 0..2 (forked)"
                                          : "[launcher] started 3 workers, ranks 0..2 (fork+exec)") == 1);
    CHECK(count_of(r.err, "[launcher] rank 2 (worker 2, pid ") == 1);
    losses[start] = losses_by_update(r.out);
    CHECK(losses[start].size() == 4);
  }
  CHECK(losses["fork"] == losses["exec"]);
}
