// Level 2 of the distributed tests: real hetseq-train processes over loopback, each rank its own
// process (or a node's launcher starting its workers), waited for with deadlines.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/core/error.h"
#include "support/mnist_files.h"
#include "support/run_output.h"
#include "support/process_checks.h"
#include "support/subprocess.h"
#include "support/test_paths.h"
#include "tasks/mnist/mnist_model.h"

using namespace hetseq::test;
using namespace std::chrono_literals;

namespace {

// The first 2000 training and 500 test images of the shipped Fashion-MNIST, written once per test process:
// real data, without every rank of every run loading and normalising all 60000 images.
const std::string& multiprocess_data() { return fashion_mnist_prefix(2000, 500); }

// Flags shared by every run: MNIST without dropout, deterministic CPU work, no validation.
std::vector<std::string> base_args(const std::string& save_dir, int updates) {
  return {binary_path("hetseq-train"), "--task", "mnist", "--data", multiprocess_data(), "--cpu", "--dropout", "0,0", "--optimizer", "sgd",
          "--lr", "0.05", "--momentum", "0.9", "--max-update", std::to_string(updates), "--disable-validation", "--num-workers", "0",
          "--intra-op-threads", "1", "--no-progress-bar", "--log-format", "json", "--save-dir", save_dir,
          "--distributed-timeout", "60", "--seed", "5"};
}

// Largest absolute difference between the parameters of two saved MNIST models.
double max_param_diff(const std::string& a, const std::string& b) {
  hetseq::mnist::MnistNet x, y;
  hetseq::load_model(*x, a);
  hetseq::load_model(*y, b);
  double diff = 0;
  auto px = x->parameters(), py = y->parameters();
  for (size_t i = 0; i < px.size(); ++i) diff = std::max(diff, (px[i] - py[i]).abs().max().item<double>());
  return diff;
}

// The port that a rank-0 process or launcher reports for its store.
uint16_t read_port(const Process& p) {
  REQUIRE(p.wait_for_err("listening on 127.0.0.1:", 60s));
  std::smatch m;
  const std::string err = p.err_so_far();
  REQUIRE(std::regex_search(err, m, std::regex("listening on 127\\.0\\.0\\.1:([0-9]+)")));
  return static_cast<uint16_t>(std::stoi(m[1]));
}

// Tolerance for "the same parameters": float32 sums over differently split batches differ in
// rounding only. (SGD, not Adam: Adam's first steps are lr * sign(g), which turns rounding noise in
// near-zero gradients into differences of up to lr.)
constexpr double kTolerance = 1e-5;

}  // namespace

TEST_CASE("tcp: one node of 3 workers with batches 7 13 29 trains the model of one process with batch 49",
          "[distributed][multiprocess]") {
  TempDir dir;
  const auto single = run_process(with(base_args(dir / "single", 5), {"--max-sentences", "49"}), 300s);
  require_success(single, "single process");

  // One node, launcher hosting the store on a port the system picks (port 0, read back).
  const auto node = run_process(with(base_args(dir / "dist", 5),
                                     {"--max-sentences", "7,13,29", "--distributed-gpus", "3",
                                      "--distributed-world-size", "3", "--distributed-init-method",
                                      "tcp://127.0.0.1:0"}),
                                300s);
  require_success(node, "launcher");
  CHECK_THAT(node.err, Catch::Contains("batch size 13"));
  const double diff = max_param_diff(dir / "single/checkpoint_last.pt", dir / "dist/checkpoint_last.pt");
  INFO("max |param difference| = " << diff);
  CHECK(diff < kTolerance);
}

TEST_CASE("file: 3 nodes with update-freq 1 3 2 train the model of one process with batch 104",
          "[distributed][multiprocess]") {
  TempDir dir;
  const auto single = run_process(with(base_args(dir / "single", 5), {"--max-sentences", "104"}), 300s);
  require_success(single, "single process");

  // 7*1 + 13*3 + 29*2 = 104 samples per update.
  const std::vector<std::pair<int, int>> ranks{{7, 1}, {13, 3}, {29, 2}};
  std::vector<std::vector<std::string>> commands;
  for (size_t r = 0; r < ranks.size(); ++r) {
    commands.push_back(with(base_args(dir / "dist", 5),
                            {"--max-sentences", std::to_string(ranks[r].first), "--update-freq",
                             std::to_string(ranks[r].second), "--distributed-world-size", "3", "--distributed-rank",
                             std::to_string(r), "--distributed-init-method", "file://" + (dir / "rendezvous"),
                             "--fast-stat-sync"}));
  }
  const auto results = run_processes(commands, 300s);
  for (size_t r = 0; r < results.size(); ++r) require_success(results[r], "rank " + std::to_string(r));
  const double diff = max_param_diff(dir / "single/checkpoint_last.pt", dir / "dist/checkpoint_last.pt");
  INFO("max |param difference| = " << diff);
  CHECK(diff < kTolerance);
}

TEST_CASE("env: 2 ranks started as torchrun would", "[distributed][multiprocess]") {
  TempDir dir;
  auto args = with(base_args(dir / "dist", 4), {"--max-sentences", "16", "--distributed-init-method", "env://"});
  Process rank0(args, {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "0"}, {"RANK", "0"}, {"WORLD_SIZE", "2"},
                       {"LOCAL_RANK", "0"}});
  const uint16_t port = read_port(rank0);
  Process rank1(args, {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}, {"RANK", "1"},
                       {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  require_success(rank0.wait(300s), "rank 0");
  require_success(rank1.wait(300s), "rank 1");
  CHECK(std::filesystem::exists(dir / "dist/checkpoint_last.pt"));
}

TEST_CASE("a worker killed while the others wait in a shared-memory reduction: they fail at once, naming its rank "
          "and process",
          "[distributed][multiprocess][shm]") {
  TempDir dir;
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 3; ++r) {
    auto args = with(base_args(dir / "dist", 100000),
                     {"--max-sentences", "8", "--distributed-world-size", "3", "--distributed-rank", std::to_string(r),
                      "--distributed-init-method", "file://" + (dir / "rendezvous"), "--shared-memory-reduce", "on",
                      "--log-interval", "1000000", "--no-save"});
    ranks.push_back(std::make_unique<Process>(args));
  }
  REQUIRE(ranks[0]->wait_for_err("[train] ", 120s));  // the training loop has started
  std::this_thread::sleep_for(1s);                       // and is well into its updates
  // Rank 1 stops wherever it is; the others run on to the next bucket that needs its gradients and wait there, in
  // the shared-memory barrier (the statistics' Gloo allreduce started before the forward pass has nothing to wait
  // for until backward is over). Then it is killed, a zombie until this test reaps it.
  const int victim = ranks[1]->pid();
  REQUIRE(::kill(victim, SIGSTOP) == 0);
  std::this_thread::sleep_for(1500ms);
  ranks[1]->kill();
  const auto killed = std::chrono::steady_clock::now();
  for (int r : {0, 2}) {
    const auto result = ranks[r]->wait(20s);  // a broken detection fails in 20 s, not --distributed-timeout's 60
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    INFO("rank " << r << " exited " << seconds << " s after the kill; stderr:\n" << result.err);
    CHECK(!result.timed_out);
    CHECK(result.exit_code == hetseq::kExitPeerLost);  // restartable: see the README's exit codes
    // The barrier saw the process gone (Note [Shared-memory reduction]), not the 60 s of --distributed-timeout.
    CHECK_THAT(result.err, Catch::Contains("hetseq-train: error: rank " + std::to_string(r) +
                                           " of 3: the shared-memory reduction of gradient bucket ") &&
                               Catch::Contains(" failed: rank 1 (process " + std::to_string(victim) +
                                               ") has exited (a peer died"));
    CHECK(seconds < 10);
  }
}

TEST_CASE("a rank that never arrives is named in the error", "[distributed][multiprocess]") {
  TempDir dir;
  const auto r = run_process(with(base_args(dir / "dist", 5),
                                  {"--max-sentences", "8", "--distributed-world-size", "2", "--distributed-rank", "0",
                                   "--distributed-init-method", "file://" + (dir / "rendezvous"),
                                   "--distributed-timeout", "3"}),
                             60s);
  CHECK(!r.timed_out);
  CHECK(r.exit_code == hetseq::kExitPeerLost);
  CHECK_THAT(r.err, Catch::Contains("rank(s) 1 of 2 never arrived"));
}

TEST_CASE("ranks that disagree on world size or model get a clear error", "[distributed][multiprocess]") {
  TempDir dir;
  SECTION("world size") {
    const auto results = run_processes(
        {with(base_args(dir / "a", 5), {"--max-sentences", "8", "--distributed-world-size", "2", "--distributed-rank",
                                        "0", "--distributed-init-method", "file://" + (dir / "rdv1"),
                                        "--distributed-timeout", "5"}),
         with(base_args(dir / "a", 5), {"--max-sentences", "8", "--distributed-world-size", "3", "--distributed-rank",
                                        "1", "--distributed-init-method", "file://" + (dir / "rdv1"),
                                        "--distributed-timeout", "5"})},
        120s);
    for (const auto& r : results) {
      INFO(r.err);
      CHECK(!r.timed_out);
      CHECK(r.exit_code == hetseq::kExitPeerLost);
    }
    // Each waits at the start barrier of its own world size (Note [Rendezvous keys]) and names the
    // rank that came for a world of another size.
    CHECK_THAT(results[1].err, Catch::Contains("hetseq-train: error: rank 1: rank(s) 0, 2 of 3 never arrived within "
                                               "5 s; rank 0 (host ") &&
                                   Catch::Contains(") was started with --distributed-world-size 2"));
    CHECK_THAT(results[0].err, Catch::Contains("hetseq-train: error: rank 0: rank(s) 1 of 2 never arrived within 5 s; "
                                               "rank 1 (host ") &&
                                   Catch::Contains(") was started with --distributed-world-size 3"));
  }
  SECTION("model") {
    const auto results = run_processes(
        {with(base_args(dir / "m", 5), {"--max-sentences", "8", "--distributed-world-size", "2", "--distributed-rank",
                                        "0", "--distributed-init-method", "file://" + (dir / "rdv3")}),
         with(base_args(dir / "m", 5), {"--max-sentences", "8", "--distributed-world-size", "2", "--distributed-rank",
                                        "1", "--distributed-init-method", "file://" + (dir / "rdv3"),
                                        "--hidden-units", "64"})},
        120s);
    for (const auto& r : results) {
      INFO(r.err);
      CHECK(!r.timed_out);
      CHECK(r.exit_code == hetseq::kExitInput);
      CHECK_THAT(r.err, Catch::Contains("disagree on model") && Catch::Contains("rank 1"));
    }
  }
  // Ranks that differ in a flag: tests/cli/test_world_cli.cpp.
}

TEST_CASE("with unequal batches and update-freqs every sample of an epoch is used exactly once",
          "[distributed][multiprocess]") {
  // 29*2 + 13*3 + 7*1 = 104 samples per update: 9 full updates and a short last one of 64, in which
  // rank 0 gets 29 + 29, rank 1 6 + 0 + 0 and rank 2 nothing: empty micro-batches, and a rank with no
  // sample at all, whose statistics the sync must accept with and without --fast-stat-sync.
  const std::vector<std::pair<int, int>> ranks{{29, 2}, {13, 3}, {7, 1}};
  const bool fast = GENERATE(false, true);
  CAPTURE(fast);
  TempDir dir;
  write_random_mnist(dir.path(), 1000, 10);
  std::vector<std::vector<std::string>> commands;
  for (size_t r = 0; r < ranks.size(); ++r) {
    commands.push_back(with(base_args(dir / "ckpt", 0),
                            {"--data", dir.path(), "--max-epoch", "2", "--max-sentences", std::to_string(ranks[r].first),
                             "--update-freq", std::to_string(ranks[r].second), "--distributed-world-size", "3",
                             "--distributed-rank", std::to_string(r), "--distributed-init-method",
                             "file://" + (dir / "rendezvous"), "--dump-sample-ids", dir / "ids"}));
    if (fast) commands.back().push_back("--fast-stat-sync");
  }
  const auto results = run_processes(commands, 300s);
  for (size_t r = 0; r < results.size(); ++r) require_success(results[r], "rank " + std::to_string(r));
  std::map<int64_t, std::vector<int64_t>> used;  // [epoch] sample ids over all ranks
  std::map<int64_t, std::set<int64_t>> updates;  // [rank] update numbers it took part in
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> counts;  // [(epoch, update)] samples of each rank
  for (int r = 0; r < 3; ++r) {
    const auto lines = read_sample_ids(dir / "ids", r);
    REQUIRE(lines);
    for (const auto& line : *lines) {
      updates[r].insert(line.update);
      used[line.epoch].insert(used[line.epoch].end(), line.ids.begin(), line.ids.end());
      counts[{line.epoch, line.update}].push_back(static_cast<int64_t>(line.ids.size()));
    }
  }
  std::vector<int64_t> all(1000);
  std::iota(all.begin(), all.end(), 0);
  REQUIRE(used.size() == 2);
  for (auto& [epoch, ids] : used) {
    INFO("epoch " << epoch);
    std::sort(ids.begin(), ids.end());
    CHECK(ids == all);
  }
  // Every rank takes part in the same 20 updates, the short last ones included.
  for (int r = 0; r < 3; ++r) CHECK(updates[r].size() == 20);
  // Each epoch's last update: the 64 samples left, from ranks 0 and 1 only.
  size_t short_updates = 0;
  for (const auto& [at, per_rank] : counts) {
    if (per_rank == std::vector<int64_t>{58, 39, 7}) continue;
    CAPTURE(at.first, at.second);
    CHECK(per_rank == std::vector<int64_t>{58, 6, 0});
    ++short_updates;
  }
  CHECK(short_updates == 2);
}

TEST_CASE("a file rendezvous is removed after a run and a stale one is a clear error", "[distributed][multiprocess]") {
  TempDir dir;
  const std::string rdv = dir / "rendezvous";
  auto ranks = [&](const std::string& save_dir) {
    std::vector<std::vector<std::string>> commands;
    for (int r = 0; r < 2; ++r) {
      commands.push_back(with(base_args(save_dir, 2),
                              {"--max-sentences", "8", "--distributed-world-size", "2", "--distributed-rank",
                               std::to_string(r), "--distributed-init-method", "file://" + rdv}));
    }
    return commands;
  };
  for (int run = 0; run < 2; ++run) {  // the same command twice: the first run leaves no file behind
    CAPTURE(run);
    const auto results = run_processes(ranks(dir / ("save" + std::to_string(run))), 300s);
    for (size_t r = 0; r < results.size(); ++r) require_success(results[r], "rank " + std::to_string(r));
    CHECK(!std::filesystem::exists(rdv));
  }
  // A file left by a killed run: rank 0 finds its own arrival from before.
  {  // The first run's generation and rank 0's claim, by a process that is gone (Note [Rendezvous keys]).
    c10d::FileStore stale(rdv, 2);
    const std::string gen = "g1-1";
    stale.set("hetseq/run/0/generation", std::vector<uint8_t>(gen.begin(), gen.end()));
    stale.add("hetseq/run/0/g1-1/rank/0", 1);
  }
  // Rank 1 fails either with rank 0's message, which rank 0 writes where rank 1 waits at the start barrier
  // (Note [Rendezvous keys]), or, when rank 0 gave up before rank 1 read the round's generation, as a rank
  // whose rank 0 never arrived within its own --distributed-timeout (5 s here): which one is a race.
  auto stale_ranks = ranks(dir / "stale");
  for (auto& r : stale_ranks) r = with(r, {"--distributed-timeout", "5"});
  const auto results = run_processes(stale_ranks, 120s);
  INFO(results[0].err << "\nrank 1:\n" << results[1].err);
  CHECK(results[0].exit_code == hetseq::kExitInput);
  CHECK_THAT(results[0].err, Catch::Contains("earlier run") && Catch::Contains(rdv));
  CHECK(!results[1].timed_out);
  if (results[1].exit_code == hetseq::kExitInput) {
    CHECK_THAT(results[1].err, Catch::Contains("earlier run") && Catch::Contains(rdv));
  } else {
    CHECK(results[1].exit_code == hetseq::kExitPeerLost);
    CHECK_THAT(results[1].err, Catch::Contains("hetseq-train: error: rank 1: rank 0 never arrived at 'file://" + rdv +
                                               "' within 5 s"));
  }
}
