// Stop and resume with real hetseq-train processes: bit-identical continuation, resume on another
// cluster with every sample of the epoch used exactly once, processes killed while saving, validation
// choosing checkpoint_best.pt, retention, the errors of bad checkpoint files, and Python reading the
// weights.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/core/error.h"
#include "support/hooked_train.h"
#include "support/mnist_files.h"
#include "support/run_output.h"
#include "support/process_checks.h"
#include "support/save_pause.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;
using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// The logged training loss per update number.
}  // namespace

TEST_CASE("a run stopped mid-epoch and resumed is bit-identical to the run never stopped", "[checkpoint][resume]") {
  TempDir dir;
  write_random_mnist(dir.path(), 600, 50);
  // Two workers of one node, batches 8 and 16, update-freq 3: 72 samples per update, dropout on.
  auto node = [&](const std::string& save_dir, int updates) {
    return with(mnist_train_args(dir.path(), save_dir),
                {"--max-sentences", "8,16", "--update-freq", "3", "--distributed-gpus", "2", "--distributed-world-size",
                 "2", "--distributed-init-method", "tcp://127.0.0.1:0", "--max-update", std::to_string(updates),
                 "--disable-validation"});
  };
  const auto straight = run_process(node(dir / "straight", 7), 300s);
  require_success(straight, "uninterrupted run");
  const auto first = run_process(node(dir / "resumed", 4), 300s);
  require_success(first, "run stopped after update 4");
  const auto second = run_process(node(dir / "resumed", 7), 300s);
  require_success(second, "resumed run");
  CHECK_THAT(second.err, Contains("resumed from") && Contains("at sample 288"));

  const auto a = hetseq::load_checkpoint(dir / "straight/checkpoint_last.pt");
  const auto b = hetseq::load_checkpoint(dir / "resumed/checkpoint_last.pt");
  CHECK(a.num_updates == 7);
  CHECK(b.num_updates == 7);
  CHECK(a.offset == b.offset);
  check_same_training_state(a, b);
  // The same losses, update for update (the meters continue across the stop).
  const auto la = losses_by_update(straight.out), lb = losses_by_update(first.out + second.out);
  REQUIRE(la.size() == 7);
  CHECK(la == lb);
}

TEST_CASE("a run resumed on another world size with other batch sizes uses every sample of the epoch once",
          "[checkpoint][resume]") {
  TempDir dir;
  write_random_mnist(dir.path(), 300, 40);
  const std::string ids = dir / "ids";
  // First cluster: 3 nodes of one rank, batches 7, 13, 29 (49 per update), stopped after 3 updates.
  std::vector<std::vector<std::string>> first;
  const std::vector<int> batches{7, 13, 29};
  for (size_t r = 0; r < batches.size(); ++r) {
    first.push_back(with(mnist_train_args(dir.path(), dir / "ckpt"),
                         {"--max-sentences", std::to_string(batches[r]), "--distributed-world-size", "3",
                          "--distributed-rank", std::to_string(r), "--distributed-init-method",
                          "file://" + (dir / "rendezvous"), "--max-update", "3", "--disable-validation",
                          "--dump-sample-ids", ids}));
  }
  const auto results = run_processes(first, 300s);
  for (size_t r = 0; r < results.size(); ++r) require_success(results[r], "first cluster, rank " + std::to_string(r));
  // Second cluster: one node of 2 workers, batches 16 and 40 (56 per update), to the end of the epoch.
  const auto second = run_process(with(mnist_train_args(dir.path(), dir / "ckpt"),
                                       {"--max-sentences", "16,40", "--distributed-gpus", "2", "--distributed-world-size",
                                        "2", "--distributed-init-method", "tcp://127.0.0.1:0", "--max-epoch", "1",
                                        "--disable-validation", "--dump-sample-ids", ids}),
                                  300s);
  require_success(second, "second cluster");
  CHECK_THAT(second.err, Contains("the data plan changed") && Contains("[7,13,29]") && Contains("[16,40]"));

  std::vector<int64_t> used;
  for (int r = 0; r < 3; ++r) {
    const auto lines = read_sample_ids(ids, r);
    REQUIRE((r == 2 || lines));
    for (const auto& line : lines.value_or(std::vector<SampleIdLine>{})) {
      REQUIRE(line.epoch == 1);
      used.insert(used.end(), line.ids.begin(), line.ids.end());
    }
  }
  std::sort(used.begin(), used.end());
  std::vector<int64_t> all(300);
  std::iota(all.begin(), all.end(), 0);
  CHECK(used == all);  // every sample once: none repeated, none skipped

  const auto last = hetseq::load_checkpoint(dir / "ckpt/checkpoint_last.pt");
  CHECK(last.num_updates == 3 + 3);  // 147 samples, then 153 = 56 + 56 + 41
  CHECK(last.epoch == 2);
  CHECK(last.offset == 0);
  CHECK(last.data_plan.batch_sizes == std::vector<int64_t>{16, 40});
}

TEST_CASE("a process killed while saving always leaves a loadable checkpoint_last.pt", "[checkpoint][resume]") {
  TempDir dir;
  write_random_mnist(dir.path(), 300, 10);
  const std::string save_dir = dir / "ckpt";
  const auto args = with(mnist_train_args(dir.path(), save_dir),
                         {"--max-sentences", "32", "--save-interval-updates", "1", "--disable-validation", "--max-epoch",
                          "1000", "--log-format", "none"});
  // Each run saves after every update, two files a save: checkpoint_E_N.pt (or checkpointE.pt), then its
  // copy to checkpoint_last.pt. The third save is held with all its bytes in a temporary file not yet
  // renamed (Note [Save pause]), and the run is killed there: always inside a save, and every other run
  // inside the write of checkpoint_last.pt itself (write 6), the file the next run resumes from.
  int64_t previous = 0;
  for (int kill = 0; kill < 6; ++kill) {
    CAPTURE(kill);
    const SavePause pause(dir / ("pause-" + std::to_string(kill)));
    const bool last_file = kill % 2 == 1;
    Process p(hooked(args), {{kSavePauseEnv, pause.at(last_file ? 6 : 5)}});
    REQUIRE(p.wait_for_err("[save-pause]", 120s));
    if (last_file) {
      CHECK_THAT(p.err_so_far(), Contains("checkpoint write 6 (" + save_dir + "/checkpoint_last.pt)"));
    } else {
      CHECK_THAT(p.err_so_far(), Contains("checkpoint write 5 (" + save_dir + "/checkpoint") &&
                                     !Contains("checkpoint_last.pt) paused"));
    }
    p.kill();
    p.wait(30s);
    bool interrupted = false;  // this run's temporary file, never renamed
    for (const auto& e : fs::directory_iterator(save_dir)) {
      interrupted |= e.path().filename().string().find(".hetseq-tmp-" + std::to_string(p.pid())) != std::string::npos;
    }
    CHECK(interrupted);
    const auto c = hetseq::load_checkpoint(fs::path(save_dir) / "checkpoint_last.pt");
    CHECK(c.num_updates == previous + 2);  // resumed from the last run's checkpoint, two more saved
    previous = c.num_updates;
  }
}

TEST_CASE("validation picks checkpoint_best.pt and retention keeps what the flags say", "[checkpoint][resume]") {
  TempDir dir;
  write_random_mnist(dir.path(), 300, 60);
  // 10 updates per epoch; interval saves every 3 updates, the last 2 kept; the last epoch file kept.
  const auto run = run_process(with(mnist_train_args(dir.path(), dir / "ckpt"),
                                    {"--max-sentences", "32", "--max-epoch", "4", "--save-interval-updates", "3",
                                     "--keep-interval-updates", "2", "--keep-last-epochs", "1", "--valid-subset",
                                     "test"}),
                               300s);
  require_success(run, "training with validation");
  std::set<std::string> present;
  for (const auto& e : fs::directory_iterator(dir / "ckpt")) present.insert(e.path().filename().string());
  CHECK(present == std::set<std::string>{"checkpoint_4_36.pt", "checkpoint_4_39.pt", "checkpoint4.pt",
                                         "checkpoint_best.pt", "checkpoint_last.pt"});
  const auto valid = json_lines(run.out, "valid");
  REQUIRE(valid.size() == 4 + 12);  // every epoch end and every interval save
  double best = 1e300;
  for (const auto& row : valid) best = std::min(best, row["loss"].get<double>());
  const auto saved = hetseq::load_checkpoint(dir / "ckpt/checkpoint_best.pt");
  REQUIRE(saved.best);
  CHECK(*saved.best == Approx(best).epsilon(1e-9));

  // Accuracy, larger is better.
  const auto acc = run_process(with(mnist_train_args(dir.path(), dir / "acc"),
                                    {"--max-sentences", "32", "--max-epoch", "3", "--valid-subset", "test",
                                     "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
                                     "--no-epoch-checkpoints"}),
                               300s);
  require_success(acc, "training with accuracy as the metric");
  double best_acc = -1;
  for (const auto& row : json_lines(acc.out, "valid")) best_acc = std::max(best_acc, row["accuracy"].get<double>());
  const auto saved_acc = hetseq::load_checkpoint(dir / "acc/checkpoint_best.pt");
  REQUIRE(saved_acc.best);
  CHECK(*saved_acc.best == Approx(best_acc).epsilon(1e-9));
  CHECK(!fs::exists(dir / "acc/checkpoint1.pt"));
}

TEST_CASE("bad checkpoints and resume mismatches are clear errors", "[checkpoint][resume]") {
  TempDir dir;
  write_random_mnist(dir.path(), 100, 10);
  const auto base = with(mnist_train_args(dir.path(), dir / "ckpt"), {"--max-sentences", "32", "--disable-validation"});
  require_success(run_process(with(base, {"--max-update", "2"}), 120s), "first run");
  const std::string last = dir / "ckpt/checkpoint_last.pt";

  std::ifstream in(last, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto write = [](const std::string& path, const std::vector<char>& b) {
    std::ofstream out(path, std::ios::binary);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  write(dir / "truncated.pt", std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2)));
  auto flipped = bytes;
  flipped[bytes.size() / 2] = static_cast<char>(flipped[bytes.size() / 2] ^ 0x20);
  write(dir / "flipped.pt", flipped);
  for (const std::string name : {"truncated.pt", "flipped.pt"}) {
    const auto r = run_process(with(base, {"--max-update", "4", "--restore-file", dir / name}), 120s);
    INFO(r.err);
    CHECK(r.exit_code == hetseq::kExitInput);
    CHECK_THAT(r.err, Contains(dir / name));
  }
  const auto missing = run_process(with(base, {"--max-update", "4", "--restore-file", dir / "nope.pt"}), 120s);
  CHECK(missing.exit_code == hetseq::kExitInput);
  CHECK_THAT(missing.err, Contains("--restore-file") && Contains("nope.pt"));

  const auto other_model = run_process(with(base, {"--max-update", "4", "--hidden-units", "64"}), 120s);
  CHECK(other_model.exit_code == hetseq::kExitInput);
  CHECK_THAT(other_model.err, Contains(last) && Contains("other parameters"));

  const auto sgd = run_process(with(base, {"--max-update", "4", "--optimizer", "sgd"}), 120s);
  CHECK(sgd.exit_code == hetseq::kExitInput);
  CHECK_THAT(sgd.err, Contains("--reset-optimizer"));
  // With the reset, the run continues from the saved weights and update count with a new optimizer.
  const auto reset = run_process(with(base, {"--max-update", "4", "--optimizer", "sgd", "--reset-optimizer",
                                             "--reset-lr-scheduler"}),
                                 120s);
  require_success(reset, "resume with --reset-optimizer");
  CHECK(hetseq::load_checkpoint(last).num_updates == 4);
  CHECK(hetseq::load_checkpoint(last).optimizer_name == "sgd");

  const auto overrides = run_process(with(base, {"--max-update", "5", "--optimizer", "sgd",
                                                 "--optimizer-overrides", "momentum=0.5"}),
                                     120s);
  require_success(overrides, "resume with --optimizer-overrides");
  CHECK(hetseq::load_checkpoint(last).optimizer_options.at("momentum") == 0.5);
  const auto bad = run_process(with(base, {"--max-update", "6", "--optimizer", "sgd", "--optimizer-overrides",
                                           "momentum=__import__('os')"}),
                               120s);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("--optimizer-overrides"));
}

TEST_CASE("Python reads a checkpoint's weights with torch.load", "[checkpoint][python]") {
  const std::string python = python_path();
  REQUIRE(!python.empty());  // the venv of scripts/setup.sh; set HETSEQ_PYTHON at configure time otherwise
  TempDir dir;
  write_random_mnist(dir.path(), 100, 10);
  require_success(run_process(with(mnist_train_args(dir.path(), dir / "ckpt"),
                                   {"--max-sentences", "32", "--max-update", "2", "--disable-validation"}),
                              120s),
                  "training");
  const std::string path = dir / "ckpt/checkpoint_last.pt";
  const auto r = run_process({python, source_dir() + "/scripts/checkpoint_weights.py", path,
                              "--summary"},
                             120s);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto summary = nlohmann::json::parse(r.out);
  const auto c = hetseq::load_checkpoint(path);
  REQUIRE(summary.size() == c.model.size());
  for (const auto& [name, t] : c.model) {
    INFO(name);
    REQUIRE(summary.contains(name));
    CHECK(summary[name]["shape"].get<std::vector<int64_t>>() == t.sizes().vec());
    CHECK(summary[name]["sum"].get<double>() == Approx(t.to(torch::kFloat64).sum().item<double>()).epsilon(1e-12));
  }
}
