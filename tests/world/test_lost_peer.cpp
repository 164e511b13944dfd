// A lost peer is exit code 4 with one line naming the rank or the collective, wherever it dies (issue 37):
// the backend's own errors of a lost peer recognised (level 1), and SIGKILL of rank 1 of a 3-rank
// --zero-sharding os run that saves after every update, at each point of a save that the save pause can
// hold and once in an update (level 2: hetseq-train processes over Gloo loopback). See Note [Lost writers]
// and Note [Lost peers in collectives].
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/shard/optimizer_shards.h"
#include "hetseq/cli/train_command.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/world/lost_peer.h"
#include "support/hooked_train.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/run_output.h"
#include "support/save_pause.h"
#include "support/subprocess.h"

namespace fs = std::filesystem;
using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

constexpr int kLostPeerTimeout = 15;  // --distributed-timeout of the runs, s

// Rank r's command line of a 3-rank os run (batch sizes 7, 13, 29: 49 samples an update), budgets 1:1:2,
// --distributed-timeout 15 s and --checkpoint-timeout 300 s (a survivor that waits for it fails the test's
// deadline), up to update `updates`, with `saves` a checkpoint after every update in `dir`/ck (else none), and
// with `gloo` the gradients summed over Gloo as across machines (else through shared memory, as on one).
std::vector<std::vector<std::string>> lost_peer_commands(const std::string& dir, int updates, bool saves,
                                                         bool gloo) {
  static int run = 0;
  const std::string rendezvous = dir + "/rendezvous" + std::to_string(run++);
  const std::vector<std::string> batches{"7", "13", "29"}, budgets{"1", "1", "2"};
  std::vector<std::vector<std::string>> out;
  for (size_t r = 0; r < 3; ++r) {
    auto args = mnist_train_args(fashion_mnist_prefix(1500, 100), dir + "/ck");
    *(std::find(args.begin(), args.end(), "--distributed-timeout") + 1) = std::to_string(kLostPeerTimeout);
    out.push_back(with(with(args, {"--max-update", std::to_string(updates), "--disable-validation", "--max-sentences",
                                   batches[r], "--zero-sharding", "os", "--memory-budget", budgets[r],
                                   "--checkpoint-timeout", "300", "--shared-memory-reduce", gloo ? "off" : "auto",
                                   "--rendezvous-timeout", "120", "--distributed-world-size", "3",
                                   "--distributed-rank", std::to_string(r), "--distributed-init-method",
                                   "file://" + rendezvous}),
                       saves ? std::vector<std::string>{"--save-interval-updates", "1"}
                             : std::vector<std::string>{"--no-save"}));
  }
  return out;
}

// What a survivor's error line may say: rank 0 gave up on rank 1 in the save (rank 2 repeats rank 0's words),
// or a collective lost its peer.
const std::regex kWriterLost(
    R"(hetseq-train: error: rank [02] of 3: (rank 0 could not write the checkpoint: rank 0 of 3: )?rank 1 stopped )"
    R"(showing progress while writing its part of the checkpoint at update \d+ \(no heartbeat for 15 s, )"
    R"(--distributed-timeout\): it died or hangs)");
const std::regex kCollectiveLost(
    R"(hetseq-train: error: rank [02] of 3: the .+ failed: .+ \(a peer died, fell behind past the process )"
    R"(group's timeout, .+\))");

}  // namespace

TEST_CASE("The backend's own errors of a lost peer are recognised, other errors are not", "[distributed][lost_peer]") {
  CHECK(hetseq::is_lost_peer(std::runtime_error(
      "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:40915: Connection reset by peer")));
  CHECK(hetseq::is_lost_peer(
      std::runtime_error("[../third_party/gloo/gloo/transport/tcp/pair.cc:586] Connection closed by peer [127.0.0.1]:1")));
  CHECK(hetseq::is_lost_peer(std::runtime_error(
      "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 15000ms for recv operation to "
      "complete")));
  CHECK(hetseq::is_lost_peer(c10::DistNetworkError("the store went away")));
  CHECK(!hetseq::is_lost_peer(hetseq::InputError("--save-dir /x: disk full")));
  CHECK(!hetseq::is_lost_peer(std::runtime_error("shape mismatch")));
}

TEST_CASE("A raw Gloo error of a lost peer that escapes to the driver is exit code 4 with its words on one line",
          "[distributed][lost_peer]") {
  std::ostringstream err;
  std::streambuf* const was = std::cerr.rdbuf(err.rdbuf());
  const char* const argv[] = {"hetseq-train"};
  const int code = hetseq::cli::run_guarded(
      [](int, const char* const*) -> int {
        throw std::runtime_error(
            "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:27274: Connection reset "
            "by peer");
      },
      "hetseq-train", 1, argv);
  std::cerr.rdbuf(was);
  const std::string line = err.str();
  CHECK(code == hetseq::kExitPeerLost);
  // One line; before any PeerError of this process it also says what the words mean.
  CHECK_THAT(line, Catch::StartsWith("hetseq-train: error: ") &&
                       Contains("Read error [127.0.0.1]:27274: Connection reset by peer") && Catch::EndsWith("\n"));
  CHECK(std::count(line.begin(), line.end(), '\n') == 1);
  if (!hetseq::peer_failure_seen()) CHECK_THAT(line, Contains("a collective lost a peer: "));
}

TEST_CASE("SIGKILL of rank 1 of 3 at each save point the pause holds and in an update: every survivor exits with "
          "code 4 within --distributed-timeout, naming the lost rank or the collective, and the last checkpoint loads",
          "[distributed][multiprocess][zero_shard][checkpoint][lost_peer]") {
  // Per save after update N, rank 1 writes one file (its shard: write N) and rank 0 eight (Note [Save pause]):
  // its shard (1), checkpoint_1_N's manifest (2), the 3 shards' copies for checkpoint_last (3-5) and its
  // manifest (6), checkpoint_1_N.pt (7) and its copy to checkpoint_last.pt (8). Rank 1 is killed held in its own write, or while rank 0 is
  // held in one of its writes (rank 1 then waits in the fence, its record posted: after the held write goes
  // on, the save completes and the next collective finds rank 1 gone), or in an update of a run without saves.
  // What the pause cannot hold: rank 1 between the fence's steps (share, post, the wait for rank 0's verdict)
  // writes no file; those moments are the wait in the fence that the points of rank 0 cover.
  struct Point {
    std::string name;
    int held_rank;      // -1: no save pause, rank 1 killed in an update
    int write;          // the held rank's write
    std::string file;   // the held file's name ends so
    std::vector<int64_t> on_disk;  // the updates that checkpoint_last.pt may hold afterwards (empty: no save)
    bool writer_lost;   // survivors name rank 1 in the save (else a collective; both allowed where both race)
    bool collective_lost;
    bool gloo;          // --shared-memory-reduce off: the gradients' collective is Gloo's
  };
  const std::vector<Point> points{
      // First: they train on until killed.
      {"an update", -1, 0, "", {}, false, true, false},
      {"an update, gradients over Gloo", -1, 0, "", {}, false, true, true},
      {"rank 1 writing its shard", 1, 2, ".shard-1-of-3.pt", {1}, true, false, false},
      // Rank 1 has most likely posted its record when rank 0 is held in its shard; if not, rank 0 names it.
      {"rank 0 writing its shard", 0, 9, ".shard-0-of-3.pt", {1, 2}, true, true, false},
      {"rank 0 writing the manifest, gradients over Gloo", 0, 14, ".manifest.json", {2}, false, true, true},
      {"rank 0 writing checkpoint_last.pt", 0, 16, "/checkpoint_last.pt", {2}, false, true, false},
  };
  struct Run {
    std::unique_ptr<TempDir> dir;
    std::unique_ptr<SavePause> pause;
    std::vector<std::unique_ptr<Process>> ranks;
  };
  std::vector<Run> runs;
  for (const Point& point : points) {
    Run run;
    run.dir = std::make_unique<TempDir>();
    run.pause = std::make_unique<SavePause>(*run.dir / "pause");
    const bool saves = point.held_rank >= 0;
    const auto cmds = lost_peer_commands(run.dir->path(), saves ? 100 : 100000, saves, point.gloo);
    for (size_t r = 0; r < cmds.size(); ++r) {
      std::map<std::string, std::string> env;
      if (static_cast<int>(r) == point.held_rank) env[kSavePauseEnv] = run.pause->at(point.write);
      run.ranks.push_back(std::make_unique<Process>(env.empty() ? cmds[r] : hooked(cmds[r]), env));
    }
    runs.push_back(std::move(run));
  }
  // Every run to its point, then rank 1 killed, the held write let go, and the survivors waited for.
  std::vector<std::chrono::steady_clock::time_point> killed(points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& point = points[i];
    Run& run = runs[i];
    CAPTURE(point.name);
    if (point.held_rank >= 0) {
      Process& held = *run.ranks[static_cast<size_t>(point.held_rank)];
      REQUIRE(held.wait_for_err("[save-pause]", 180s));
      const std::string said = line_with(held.err_so_far(), "[save-pause]");
      CHECK_THAT(said, Contains(fmt::format("checkpoint write {} ({}/ck/", point.write, run.dir->path())));
      CHECK_THAT(said, Contains(point.file + ") paused"));
    } else {
      // After the first update rank 0 reports the shards; a moment later rank 1 is in a later update.
      REQUIRE(run.ranks[0]->wait_for_err("[zero] rank 2: elements", 180s));
      std::this_thread::sleep_for(500ms);
    }
    run.ranks[1]->kill();
    killed[i] = std::chrono::steady_clock::now();
    if (point.held_rank == 0) run.pause->release();
  }
  const auto deadline = std::chrono::seconds(kLostPeerTimeout + 25);  // well under --checkpoint-timeout 300 s
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& point = points[i];
    Run& run = runs[i];
    CAPTURE(point.name);
    CHECK(run.ranks[1]->wait(10s).exit_code == 128 + SIGKILL);
    for (const size_t r : {size_t{0}, size_t{2}}) {
      const ProcessResult res = run.ranks[r]->wait(deadline);
      const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed[i]).count();
      INFO("rank " << r << ", " << after << " s after the kill, stderr:\n" << res.err);
      CHECK(!res.timed_out);
      CHECK(res.exit_code == hetseq::kExitPeerLost);
      const std::string line = line_with(res.err, "hetseq-train: error: ");
      const bool writer = std::regex_match(line, kWriterLost), collective = std::regex_match(line, kCollectiveLost);
      CHECK(((point.writer_lost && writer) || (point.collective_lost && collective)));
    }
    if (point.on_disk.empty()) continue;
    // The last checkpoint is whole: it loads, and its manifest and shards check out.
    const fs::path last = *run.dir / "ck/checkpoint_last.pt";
    const auto saved = hetseq::load_checkpoint(last);
    CHECK(std::count(point.on_disk.begin(), point.on_disk.end(), saved.num_updates) == 1);
    REQUIRE(saved.optimizer_shards.has_value());
    CHECK(hetseq::OptimizerShards::open(last, *saved.optimizer_shards, saved.num_updates)->manifest().num_updates ==
          saved.num_updates);
  }
  // And it resumes from the right sample: the save in rank 1's write from update 1, the one whose commit was
  // held from update 2 (49 samples an update).
  std::vector<std::vector<std::string>> resumed;
  for (const size_t i : {size_t{2}, size_t{5}}) {
    for (const auto& c : lost_peer_commands(runs[i].dir->path(), 3, true, false)) resumed.push_back(c);
  }
  const auto results = run_processes(resumed, 240s);
  require_all(results, "resumed");
  CHECK_THAT(results[0].err, Contains("1 updates done, continuing in epoch 1 at sample 49 of its order"));
  CHECK_THAT(results[3].err, Contains("2 updates done, continuing in epoch 1 at sample 98 of its order"));
}
