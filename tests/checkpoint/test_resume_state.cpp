// PowerSGD and the fp16 loss scaler across a stop, with real hetseq-train processes: a resumed run with
// --ddp-comm-hook powersgd is the uninterrupted one bit for bit (error feedback, Q and the warm-up count come
// from the checkpoint), a resume under another split or world size takes the state as Note [PowerSGD in
// checkpoints] says, and the loss scaler's count toward its window follows Note [Loss scale window on resume].
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;
using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// One node of `workers` workers with batch sizes `batches` ("8,16"), meeting over loopback.
std::vector<std::string> node(const std::string& data, const std::string& save_dir, int workers,
                              const std::string& batches, const std::vector<std::string>& more) {
  return with(with(mnist_train_args(data, save_dir),
                   {"--max-sentences", batches, "--distributed-gpus", std::to_string(workers),
                    "--distributed-world-size", std::to_string(workers), "--distributed-init-method",
                    "tcp://127.0.0.1:0", "--disable-validation"}),
              more);
}

// A copy of `from`'s checkpoint_last.pt as the only file of a new save dir `to`.
void copy_last(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  fs::copy_file(fs::path(from) / "checkpoint_last.pt", fs::path(to) / "checkpoint_last.pt");
}

}  // namespace

TEST_CASE("a PowerSGD run stopped and resumed is bit-identical to the run never stopped",
          "[checkpoint][resume][powersgd]") {
  TempDir dir;
  write_random_mnist(dir.path(), 400, 20);
  // Compression from update 3 on (2 warm-up updates), so the stop after update 4 is inside compressed updates.
  const std::vector<std::string> psgd{"--ddp-comm-hook", "powersgd", "--powersgd-start-update", "2", "--update-freq",
                                      "2"};
  auto run = [&](const std::string& save, int updates) {
    return run_process(node(dir.path(), save, 2, "8,16", with(psgd, {"--max-update", std::to_string(updates)})), 300s);
  };
  const auto straight = run(dir / "straight", 7);
  require_success(straight, "uninterrupted run");
  const auto first = run(dir / "resumed", 4);
  require_success(first, "run stopped after update 4");
  const auto saved = hetseq::load_checkpoint(dir / "resumed/checkpoint_last.pt");
  copy_last(dir / "resumed", dir / "split");
  copy_last(dir / "resumed", dir / "world");
  const auto second = run(dir / "resumed", 7);
  require_success(second, "resumed run");
  CHECK_THAT(second.err, Contains("[powersgd]") && Contains("continuing after update 4 with the Q and error feedback"));

  REQUIRE(saved.powersgd);
  CHECK(saved.powersgd->update == 3);
  CHECK(saved.powersgd->world_size == 2);
  REQUIRE(!saved.powersgd->buckets.empty());
  int64_t matrices = 0;
  for (const auto& b : saved.powersgd->buckets) {
    matrices += static_cast<int64_t>(b.matrices.size());
    for (const auto& e : b.errors) CHECK(e.size(0) == 2);
  }
  CHECK(matrices > 0);

  const auto a = hetseq::load_checkpoint(dir / "straight/checkpoint_last.pt");
  const auto b = hetseq::load_checkpoint(dir / "resumed/checkpoint_last.pt");
  CHECK(b.num_updates == 7);
  check_same_training_state(a, b);
  REQUIRE(a.powersgd);
  REQUIRE(b.powersgd);
  CHECK(a.powersgd->update == b.powersgd->update);
  REQUIRE(a.powersgd->buckets.size() == b.powersgd->buckets.size());
  for (size_t i = 0; i < a.powersgd->buckets.size(); ++i) {
    const auto &x = a.powersgd->buckets[i], &y = b.powersgd->buckets[i];
    CAPTURE(i);
    CHECK(x.shapes == y.shapes);
    REQUIRE(x.errors.size() == y.errors.size());
    for (size_t k = 0; k < x.errors.size(); ++k) {
      CHECK(torch::equal(x.errors[k], y.errors[k]));
      CHECK(torch::equal(x.q[k], y.q[k]));
    }
  }
  const auto la = losses_by_update(straight.out), lb = losses_by_update(first.out + second.out);
  REQUIRE(la.size() == 7);
  CHECK(la == lb);


  // Another split on the same world: each rank takes back its own error feedback (the total is what counts).
  const auto split = run_process(node(dir.path(), dir / "split", 2, "16,8", with(psgd, {"--max-update", "6"})), 300s);
  require_success(split, "resumed with batches 16,8");
  CHECK_THAT(split.err, Contains("continuing after update 4 with the Q and error feedback"));
  CHECK_THAT(split.err, !Contains("does not fit this run"));
  // Another world: rank 0 takes the summed error feedback of the 2 saved ranks.
  const auto world =
      run_process(node(dir.path(), dir / "world", 3, "8,8,8", with(psgd, {"--max-update", "6"})), 300s);
  require_success(world, "resumed on 3 ranks");
  CHECK_THAT(world.err, Contains("the errors were saved by 2 ranks and this run has 3: rank 0 takes their sum"));
  const auto w = hetseq::load_checkpoint(dir / "world/checkpoint_last.pt");
  CHECK(w.num_updates == 6);
  REQUIRE(w.powersgd);
  CHECK(w.powersgd->world_size == 3);
}

TEST_CASE("an fp16 run resumed mid-window is the uninterrupted one, and under another split it keeps the loss scaler's "
          "counters, and carries its clean updates as the same share of a window that the split changed",
          "[checkpoint][resume][precision]") {
  TempDir dir;
  write_random_mnist(dir.path(), 400, 20, 5);
  // The default window: 16384 micro-batches over all ranks, 8192 updates for 2 ranks with --update-freq 1.
  auto run = [&](const std::string& save, const std::string& batches, const std::string& freq, int updates) {
    return run_process(node(dir.path(), save, 2, batches,
                            {"--fp16", "--update-freq", freq, "--max-update", std::to_string(updates)}),
                       300s);
  };
  const auto first = run(dir / "first", "8,8", "1", 5);
  require_success(first, "run stopped after update 5");
  const auto saved = hetseq::load_checkpoint(dir / "first/checkpoint_last.pt");
  REQUIRE(saved.loss_scaler.at("overflows") == 0);  // the counts below assume no overflow
  CHECK(saved.loss_scaler.at("scale_window") == 8192);
  CHECK(saved.loss_scaler.at("clean_updates") == 5);
  copy_last(dir / "first", dir / "batches");
  copy_last(dir / "first", dir / "freq");
  copy_last(dir / "first", dir / "same");

  // The same split: stopped mid-window (5 of 8192), the resumed run is the uninterrupted one, scaler included.
  const auto straight = run(dir / "straight", "8,8", "1", 8);
  require_success(straight, "uninterrupted run");
  const auto same = run(dir / "same", "8,8", "1", 8);
  require_success(same, "resumed with the same split");
  const auto s = hetseq::load_checkpoint(dir / "straight/checkpoint_last.pt");
  const auto r = hetseq::load_checkpoint(dir / "same/checkpoint_last.pt");
  check_same_training_state(s, r);
  CHECK(s.loss_scaler == r.loss_scaler);
  CHECK(r.loss_scaler.at("clean_updates") == 8);

  // Other batch sizes, the same window: the counters continue as saved.
  const auto batches = run(dir / "batches", "4,12", "1", 8);
  require_success(batches, "resumed with batches 4,12");
  const auto b = hetseq::load_checkpoint(dir / "batches/checkpoint_last.pt");
  REQUIRE(b.loss_scaler.at("overflows") == 0);
  CHECK(b.loss_scaler.at("scale_window") == 8192);
  CHECK(b.loss_scaler.at("clean_updates") == 5 + 3);
  CHECK_THAT(batches.err, !Contains("the loss scale window is"));

  // --update-freq 4: a window of 2048 updates; the 5 of 8192 become floor(5 * 2048 / 8192) = 1.
  const auto freq = run(dir / "freq", "8,8", "4", 8);
  require_success(freq, "resumed with --update-freq 4");
  CHECK_THAT(freq.err, Contains("the loss scale window is 2048 updates now and was 8192 when saved") &&
                           Contains("the 5 updates without overflow toward it count as 1"));
  const auto f = hetseq::load_checkpoint(dir / "freq/checkpoint_last.pt");
  REQUIRE(f.loss_scaler.at("overflows") == 0);
  CHECK(f.loss_scaler.at("scale_window") == 2048);
  CHECK(f.loss_scaler.at("clean_updates") == 1 + 3);
  CHECK(f.loss_scaler.at("scale") == saved.loss_scaler.at("scale"));
}
