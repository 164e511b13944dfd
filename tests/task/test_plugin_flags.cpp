// A task library loaded with --user-dir into the real hetseq-train, sharing a flag name with MNIST: each
// task gets its own default and help (Note [A task's flags are its own] in hetseq/cli/train_options.cpp).
#include <regex>

#include <catch2/catch.hpp>

#include "support/mnist_files.h"
#include "support/subprocess.h"
#include "support/test_paths.h"
#include "support/temp_dir.h"

using namespace hetseq::test;
using Catch::Contains;

namespace {

// The widths task library (tests/task/plugin/widths_task.cpp), as the build leaves it.
std::string widths_plugin() { return binary_dir() + "/test-plugins/libwidths_task.so"; }

// `text` with every run of white space made one space, so that a help line reads the same however
// cxxopts wraps and aligns it.
std::string one_spaced_help(const std::string& text) { return std::regex_replace(text, std::regex("\\s+"), " "); }

}  // namespace

TEST_CASE("a --user-dir task and MNIST both declare --hidden-units: each --task gets its own default and help",
          "[cli][task][user-dir][test-plugin]") {
  const std::string plugin = widths_plugin();
  {
    const ProcessResult r = run_hetseq_train({"--user-dir", plugin, "--task", "widths", "--help"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const std::string help = one_spaced_help(r.out);
    CHECK_THAT(help, Contains("widths task options:"));
    CHECK_THAT(help, Contains("--hidden-units N width of both hidden layers of the widths MLP (default: 32)"));
    CHECK_THAT(help, !Contains("width of the hidden fully connected layer (default: 128)"));
  }
  {
    const ProcessResult r = run_hetseq_train({"--user-dir", plugin, "--task", "mnist", "--help"});
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(one_spaced_help(r.out),
               Contains("--hidden-units N width of the hidden fully connected layer (default: 128)"));
  }
  // Trained: the model is 2 -> H -> H -> 2, H^2 + 6H + 2 parameters: 1218 at the library's 32 (17154 at 128).
  TempDir dir;
  const std::vector<std::string> run{"--user-dir", plugin, "--task", "widths", "--cpu", "--max-sentences", "10",
                                     "--max-update", "1", "--disable-validation", "--no-save", "--log-format", "none",
                                     "--save-dir", dir.path()};
  {
    const ProcessResult r = run_hetseq_train(run);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.err, Contains("[train] task widths, model with 1218 parameters,"));
  }
  {
    std::vector<std::string> given = run;
    given.insert(given.end(), {"--hidden-units", "4"});
    const ProcessResult r = run_hetseq_train(given);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.err, Contains("[train] task widths, model with 42 parameters,"));
  }
}

// Note [Compared flags] compares the running task's flags, not those of every task a program knows: a rank
// whose hetseq-train loaded a task library for another task trains MNIST with a rank that did not.
TEST_CASE("ranks of one task train together when only one of them loaded a --user-dir library of another task",
          "[cli][task][user-dir][test-plugin]") {
  TempDir dir;
  write_random_mnist(dir.path(), 120, 20);
  std::vector<std::vector<std::string>> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args{binary_path("hetseq-train"), "--task", "mnist", "--data", dir.path(), "--cpu",
                                  "--max-sentences", "8", "--max-update", "2", "--disable-validation", "--no-save",
                                  "--distributed-world-size", "2", "--distributed-rank", std::to_string(r),
                                  "--distributed-init-method", "file://" + (dir / "rendezvous"),
                                  "--distributed-timeout", "60"};
    if (r == 1) args.insert(args.begin() + 1, {"--user-dir", widths_plugin()});
    ranks.push_back(args);
  }
  const auto results = run_processes(ranks, std::chrono::seconds(120));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << " stderr:\n" << results[r].err);
    CHECK(results[r].exit_code == 0);
    CHECK_THAT(results[r].err, !Contains("disagree on --points"));
  }
  CHECK_THAT(results[1].err, Contains("[tasks] --user-dir: loaded"));
}
