// The memory check with real hetseq-train processes (level 2 of STYLE's test levels): a plan that does not
// fit stops every rank before training with one line naming the rank, the bytes it needs and the bytes it
// has; a budget of exactly the need trains. See Note [Memory that a rank needs].
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/shard/shard_plan.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/test_paths.h"
#include "tasks/mnist/mnist_model.h"

using namespace hetseq::test;
using namespace std::chrono_literals;

namespace {

// The first 500 training images of the shipped Fashion-MNIST, written once per test process.
const std::string& memory_fit_data() { return fashion_mnist_prefix(500, 100); }

// A --memory-budget in GB that hetseq-train reads back as exactly `bytes` (bytes / 2^30 is exact in a
// double, and 17 significant digits print it exactly).
std::string gb_of(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", static_cast<double>(bytes) / (int64_t{1} << 30));
  return text;
}

// Ranks with batches 7, 13, 29 (as many as `budgets`, each "" for no --memory-budget), Adam, 2 updates.
std::vector<ProcessResult> train(const std::string& dir, const std::string& sharding,
                                 const std::vector<std::string>& budgets, const std::string& run) {
  const std::vector<int> batches{7, 13, 29};
  std::vector<std::vector<std::string>> commands;
  for (size_t r = 0; r < budgets.size(); ++r) {
    auto args = with(mnist_train_args(memory_fit_data(), dir + "/ck"),
                     {"--max-update", "2", "--disable-validation", "--no-save-optimizer-state", "--max-sentences",
                      std::to_string(batches[r]), "--distributed-world-size", std::to_string(budgets.size()),
                      "--distributed-rank", std::to_string(r), "--distributed-init-method",
                      "file://" + dir + "/rendezvous-" + run, "--zero-sharding", sharding});
    if (!budgets[r].empty()) args = with(args, {"--memory-budget", budgets[r]});
    commands.push_back(args);
  }
  return run_processes(commands, 120s);
}

int64_t mnist_numel() {
  hetseq::mnist::MnistNet net;
  int64_t n = 0;
  for (const auto& p : net->parameters()) n += p.numel();
  return n;
}

// The activations that rank `rank`'s line reports (measured, so read back).
int64_t activations_in(const std::string& err) {
  std::smatch m;
  REQUIRE(std::regex_search(err, m, std::regex(R"(activations (\d+) \(one forward and backward)")));
  return std::stoll(m[1]);
}

bool nothing_in(const std::string& dir) {
  return !std::filesystem::exists(dir) || std::filesystem::is_empty(dir);
}

}  // namespace

TEST_CASE("Sharding os: a rank whose budget cannot hold the model stops every rank before training, naming it",
          "[distributed][multiprocess][zero_shard][memory]") {
  TempDir dir;
  const int64_t tiny = int64_t{1} << 20;  // 1 MiB: less than the parameters alone
  const auto ranks = train(dir.path(), "os", {gb_of(tiny), "1", "2"}, "os");
  REQUIRE(ranks.size() == 3);
  const int64_t T = mnist_numel();
  const auto plan = hetseq::plan_shards({tiny, int64_t{1} << 30, int64_t{2} << 30}, T, 16);
  for (size_t r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << ranks[r].err);
    CHECK_FALSE(ranks[r].timed_out);
    CHECK(ranks[r].exit_code == hetseq::kExitInput);
    const int64_t act = activations_in(ranks[r].err);
    CHECK(act > 7 * 784 * 4);  // at least one saved copy of the 7 images
    const int64_t gather = 4 * plan[2].numel;  // one buffer of the largest shard (rank 2's)
    const int64_t need = 4 * T + 4 * T + 2 * 4 * plan[0].numel + gather + act;
    CHECK_THAT(ranks[r].err,
               Catch::Contains(fmt::format("hetseq-train: error: --memory-budget: rank 0 needs {} bytes but has {} "
                                           "bytes available (its --memory-budget of ",
                                           need, tiny)) &&
                   Catch::Contains(fmt::format(
                       " GB): parameters {}, gradients {}, adam optimizer state {} (2 buffer(s) per element, its "
                       "shard), shard gather buffers {}, activations {} (one forward and backward of 7 samples); give "
                       "it a larger --memory-budget",
                       4 * T, 4 * T, 2 * 4 * plan[0].numel, gather, act)));
    CHECK(json_lines(ranks[r].out, "train").empty());
  }
  CHECK(nothing_in(dir / "ck"));
}

TEST_CASE("Sharding none with --memory-budget: one byte short of the need stops before training, the need itself trains",
          "[distributed][multiprocess][memory]") {
  TempDir dir;
  const int64_t T = mnist_numel();
  // Rank 1 states a budget, rank 0 does not (it is not checked).
  const auto first = train(dir.path(), "none", {"", gb_of(int64_t{1} << 20)}, "a");
  REQUIRE(first.size() == 2);
  const int64_t act = activations_in(first[1].err);
  const int64_t need = 4 * T + 4 * T + 2 * 4 * T + act;
  for (const auto& r : first) {
    CHECK(r.exit_code == hetseq::kExitInput);
    CHECK_THAT(r.err, Catch::Contains(fmt::format("--memory-budget: rank 1 needs {} bytes but has {} bytes available",
                                                  need, int64_t{1} << 20)));
    CHECK_THAT(r.err, Catch::Contains("or shard the optimizer state with --zero-sharding os"));
  }
  CHECK(nothing_in(dir / "ck"));

  const auto short_by_one = train(dir.path(), "none", {"", gb_of(need - 1)}, "b");
  for (const auto& r : short_by_one) {
    CHECK(r.exit_code == hetseq::kExitInput);
    CHECK_THAT(r.err, Catch::Contains(fmt::format("rank 1 needs {} bytes but has {} bytes available", need, need - 1)));
  }
  CHECK(nothing_in(dir / "ck"));

  const auto fits = train(dir.path(), "none", {"", gb_of(need)}, "c");
  for (size_t r = 0; r < fits.size(); ++r) require_success(fits[r], "budget of the need: rank " + std::to_string(r));
  CHECK_THAT(fits[0].err, Catch::Contains(fmt::format("[memory] rank 1: needs {:.1f} MB of its {:.1f} MB",
                                                      need / 1e6, need / 1e6)));
  CHECK(json_lines(fits[0].out, "train").size() == 2);
  CHECK(std::filesystem::exists(dir / "ck/checkpoint_last.pt"));
}
