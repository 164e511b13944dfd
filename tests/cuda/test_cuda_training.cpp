// Training on CUDA with real hetseq-train processes, each test the GPU counterpart of a CPU test: MNIST on
// one GPU (tests/cli/test_train_cli.cpp), the weighted average with CUDA ranks and a CPU rank against one
// process (tests/world/test_multiprocess.cpp), fp16 skipping and recovering and bf16
// (tests/train/test_mixed_precision_cli.cpp), and a stopped run resuming bit for bit with dropout drawn
// from the CUDA generator (tests/checkpoint/test_resume.cpp). Several ranks share GPU 0 over Gloo with CUDA
// tensors, so that one GPU runs them all. Skipped, visibly, where no CUDA device is (see cuda/cuda_skip.h).
#include <chrono>
#include <cmath>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "cuda/cuda_skip.h"
#include "hetseq/checkpoint/checkpoint_file.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"
#include "tasks/mnist/mnist_model.h"

using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// hetseq-train on the MNIST files in `data` on this process's CUDA device 0 (no --cpu), no loader threads, JSON
// log lines, checkpoints in `save_dir`; the tests add the optimizer, the world, the schedule and --log-interval.
std::vector<std::string> cuda_args(const std::string& data, const std::string& save_dir, int seed) {
  return {binary_path("hetseq-train"), "--task", "mnist", "--data", data, "--device-id", "0", "--num-workers", "0",
          "--no-progress-bar", "--log-format", "json", "--save-dir", save_dir, "--distributed-timeout", "120", "--seed",
          std::to_string(seed)};
}

// Adam with lr 0.001, as the CPU tests of the same behaviour train.
const std::vector<std::string> kAdam{"--optimizer", "adam", "--lr", "0.001"};

// Rank `rank` of `world` explicit processes on one machine, over Gloo (which carries CUDA tensors, so
// several ranks can share one GPU, which NCCL refuses), meeting at a file rendezvous in `dir`.
std::vector<std::string> gloo_rank(int rank, int world, const std::string& rendezvous) {
  return {"--distributed-world-size", std::to_string(world), "--distributed-rank", std::to_string(rank),
          "--distributed-init-method", "file://" + rendezvous, "--distributed-backend", "gloo"};
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

// The "[fp16] gradient overflow ..." lines of a log, from "at update" on.
std::vector<std::string> overflow_lines(const std::string& err) {
  std::vector<std::string> out;
  const std::regex line("gradient overflow at update [0-9]+ \\(loss scale [0-9.e+]+\\): update skipped, loss scale now "
                        "[0-9.e+]+");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it) {
    out.push_back(it->str());
  }
  return out;
}

// The logged training loss per update number.
}  // namespace

TEST_CASE("CUDA: MNIST trains Fashion-MNIST on one GPU, validates, and hetseq-eval reads the model on the GPU",
          "[cuda][cli]") {
  if (!cuda_or_skip()) return;
  TempDir dir;
  write_mnist_prefix(fashion_mnist_dir(), dir.path(), 4000, 1000);
  const auto r = run_process(with(with(cuda_args(dir.path(), dir / "save", 3), kAdam),
                                  {"--max-sentences", "64", "--max-update", "60", "--log-interval", "1",
                                   "--valid-subset", "test", "--max-sentences-valid", "500"}),
                             300s);
  require_success(r, "training on cuda:0");
  CHECK_THAT(r.err, Contains("device cuda:0"));
  const auto train = json_lines(r.out, "train");
  REQUIRE(train.size() == 60);
  for (const auto& row : train) CHECK(std::isfinite(row["loss"].get<double>()));
  CHECK(train.back()["loss"].get<double>() < train.front()["loss"].get<double>());
  const auto valid = json_lines(r.out, "valid");
  REQUIRE(valid.size() == 1);
  CHECK(valid[0]["accuracy"].get<double>() > 50.0);  // chance is 10%; about 70% after 60 updates

  const auto eval = run_process({binary_path("hetseq-eval"), "--task", "mnist", "--data", dir.path(), "--path",
                                 dir / "save/checkpoint_last.pt", "--valid-subset", "test", "--log-format", "json"},
                                120s);
  require_success(eval, "hetseq-eval on cuda:0");
  const auto evaluated = json_lines(eval.out, "valid");
  REQUIRE(!evaluated.empty());
  CHECK(evaluated.back()["accuracy"].get<double>() == Approx(valid[0]["accuracy"].get<double>()).margin(0.5));
}

TEST_CASE("CUDA: two CUDA ranks and a CPU rank with batches 7 13 29 train the model of one GPU process with batch 49",
          "[cuda][multiprocess]") {
  if (!cuda_or_skip()) return;
  TempDir dir;
  write_random_mnist(dir.path(), 300, 20, 6);
  // No dropout, SGD: the parameters depend on the weighted average of the gradients alone.
  const std::vector<std::string> recipe{"--dropout", "0,0", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
                                        "--max-update", "5", "--disable-validation"};
  const auto single =
      run_process(with(with(cuda_args(dir.path(), dir / "single", 5), recipe), {"--max-sentences", "49"}), 300s);
  require_success(single, "one process on cuda:0");
  // Ranks 0 and 2 on GPU 0, rank 1 on the CPU: the heterogeneous world of one GPU and a CPU.
  const std::vector<std::string> batch{"7", "13", "29"};
  std::vector<std::vector<std::string>> commands;
  for (int r = 0; r < 3; ++r) {
    auto args = with(with(with(cuda_args(dir.path(), dir / "dist", 5), recipe), gloo_rank(r, 3, dir / "rendezvous")),
                     {"--max-sentences", batch[r]});
    if (r == 1) args.push_back("--cpu");
    commands.push_back(args);
  }
  const auto results = run_processes(commands, 300s);
  for (int r = 0; r < 3; ++r) require_success(results[r], "rank " + std::to_string(r));
  CHECK_THAT(results[0].err, Contains("rank 0 on") && Contains("(cuda:0)") && Contains("(cpu)"));
  const double diff = max_param_diff(dir / "single/checkpoint_last.pt", dir / "dist/checkpoint_last.pt");
  INFO("max |param difference| = " << diff);
  // float32 sums in other orders (and cuDNN's choice of algorithm per batch size) differ in rounding only; a
  // wrong weighting moves parameters by about lr x gradient, 1e-3 and more, after 5 updates.
  CHECK(diff < 1e-4);
}

TEST_CASE("CUDA: fp16 on two CUDA ranks with unequal batches: both skip the same overflowing updates and train on",
          "[cuda][precision][multiprocess]") {
  if (!cuda_or_skip()) return;
  TempDir dir;
  write_random_mnist(dir.path(), 400, 20, 3);
  // A start scale of 2^30 overflows float16 at once; it halves on every overflow until the gradients fit.
  std::vector<std::vector<std::string>> commands;
  const std::vector<std::string> batch{"7", "13"};
  for (int r = 0; r < 2; ++r) {
    const auto rank = with(with(cuda_args(dir.path(), dir / "save", 13), kAdam), gloo_rank(r, 2, dir / "rendezvous"));
    commands.push_back(with(rank,
                            {"--fp16", "--fp16-init-scale", "1073741824", "--fp16-scale-window", "4", "--log-interval",
                             "1", "--max-sentences", batch[r], "--max-update", "12", "--disable-validation",
                             "--log-all-ranks"}));
  }
  const auto results = run_processes(commands, 300s);
  for (int r = 0; r < 2; ++r) require_success(results[r], "rank " + std::to_string(r));
  const auto rank0 = overflow_lines(results[0].err), rank1 = overflow_lines(results[1].err);
  INFO("rank 0 stderr:\n" << results[0].err);
  CHECK(rank0.size() >= 10);  // at least 2^30 -> 2^20 before float16 holds the gradients
  CHECK(rank0 == rank1);
  CHECK_THAT(results[0].err, Contains("[fp16] float16 forward passes (autocast on cuda:0)") &&
                                 Contains("doubled after 4 updates"));
  for (const auto& r : results) CHECK_THAT(r.err, Contains("done: 12 updates"));

  const auto ck = hetseq::load_checkpoint(dir / "save/checkpoint_last.pt");
  CHECK(ck.num_updates == 12);
  REQUIRE(ck.loss_scaler.count("scale"));
  CHECK(ck.loss_scaler.at("overflows") == static_cast<double>(rank0.size()));
  const auto train = json_lines(results[0].out, "train");
  REQUIRE(train.size() == 12);
  for (size_t i = 0; i < train.size(); ++i) {
    INFO("line " << i);
    CHECK(train[i]["num_updates"].get<int64_t>() == static_cast<int64_t>(i) + 1);
    CHECK(std::isfinite(train[i]["loss"].get<double>()));
    CHECK(std::isfinite(train[i]["gnorm"].get<double>()));
  }
  CHECK(train.back()["loss_scale"].get<double>() == ck.loss_scaler.at("scale"));
}

TEST_CASE("CUDA: bf16 trains Fashion-MNIST on one GPU and validates", "[cuda][precision][cli]") {
  if (!cuda_or_skip()) return;
  TempDir dir;
  write_mnist_prefix(fashion_mnist_dir(), dir.path(), 2000, 1000);
  const auto r = run_process(with(with(cuda_args(dir.path(), dir / "save", 3), kAdam),
                                  {"--bf16", "--max-sentences", "32", "--max-update", "40", "--log-interval", "10",
                                   "--valid-subset", "test", "--max-sentences-valid", "500"}),
                             300s);
  require_success(r, "bf16 run on cuda:0");
  CHECK_THAT(r.err, Contains("[bf16] bfloat16 forward passes (autocast on cuda:0)"));
  const auto train = json_lines(r.out, "train");
  REQUIRE(train.size() == 4);
  CHECK(!train.back().contains("loss_scale"));
  CHECK(train.back()["loss"].get<double>() < train.front()["loss"].get<double>());
  const auto valid = json_lines(r.out, "valid");
  REQUIRE(valid.size() == 1);
  CHECK(valid[0]["accuracy"].get<double>() > 30.0);  // chance is 10%
}

TEST_CASE("CUDA: a run stopped mid-epoch and resumed is bit-identical to the run never stopped, CUDA dropout included",
          "[cuda][checkpoint][resume]") {
  if (!cuda_or_skip()) return;
  TempDir dir;
  write_random_mnist(dir.path(), 600, 50);
  // MNISTNet's dropout (on by default) draws its masks from the CUDA generator, which every update reseeds from
  // (seed, update, rank) (Note [Generator states in checkpoints]): a resumed run continues bit for bit only if
  // the update count, the data plan and the optimizer state come back as they were. --deterministic: without it
  // two uninterrupted runs already differ on an H100 (Note [Deterministic GPU kernels]).
  auto run = [&](const std::string& save_dir, int updates) {
    return run_process(with(with(cuda_args(dir.path(), save_dir, 11), kAdam),
                            {"--max-sentences", "24", "--update-freq", "3", "--log-interval", "1", "--max-update",
                             std::to_string(updates), "--disable-validation", "--deterministic"}),
                       300s);
  };
  const auto straight = run(dir / "straight", 7);
  require_success(straight, "uninterrupted run");
  const auto again = run(dir / "again", 7);
  require_success(again, "second uninterrupted run");
  const auto first = run(dir / "resumed", 4);
  require_success(first, "run stopped after update 4");
  const auto second = run(dir / "resumed", 7);
  require_success(second, "resumed run");
  CHECK_THAT(second.err, Contains("resumed from") && Contains("at sample 288"));

  const auto a = hetseq::load_checkpoint(dir / "straight/checkpoint_last.pt");
  const auto b = hetseq::load_checkpoint(dir / "resumed/checkpoint_last.pt");
  const auto c = hetseq::load_checkpoint(dir / "again/checkpoint_last.pt");
  CHECK(a.num_updates == 7);
  CHECK(b.num_updates == 7);
  CHECK(a.offset == b.offset);
  {
    INFO("two uninterrupted runs: if these differ, the GPU's kernels are not deterministic, and so neither is a "
         "resume");
    check_same_training_state(a, c);
  }
  {
    INFO("the resumed run against the uninterrupted one");
    check_same_training_state(a, b);
  }
  const auto la = losses_by_update(straight.out), lb = losses_by_update(first.out + second.out);
  REQUIRE(la.size() == 7);
  CHECK(la == lb);
}
