// --fp16 and --bf16 with real hetseq-train processes: two ranks with unequal batches skip the same
// overflowing updates, a stopped fp16 run resumes bit-identically (loss scale included), and bf16
// trains Fashion-MNIST on the CPU. See Note [Loss scaling].
#include <chrono>
#include <cmath>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/checkpoint/resume_check.h"
#include "support/mnist_files.h"
#include "support/run_output.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"

using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// The runs of this file: seed 13, no validation.
std::vector<std::string> mnist_args(const std::string& data, const std::string& save_dir) {
  return with(mnist_train_args(data, save_dir, 13), {"--disable-validation"});
}

// The "[fp16] gradient overflow ..." lines of a log, from "at update" on (without time or rank prefix).
std::vector<std::string> overflow_lines(const std::string& err) {
  std::vector<std::string> out;
  const std::regex line("gradient overflow at update [0-9]+ \\(loss scale [0-9.e+]+\\): update skipped, loss scale now "
                        "[0-9.e+]+");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it) {
    out.push_back(it->str());
  }
  return out;
}

}  // namespace

TEST_CASE("fp16 on two ranks with unequal batches: both skip the same overflowing updates and train on",
          "[precision][multiprocess]") {
  TempDir dir;
  write_random_mnist(dir.path(), 400, 20, 3);
  // A start scale of 2^30 overflows float16 at once; it halves on every overflow until the gradients fit.
  std::vector<std::vector<std::string>> commands;
  const std::vector<std::string> batch{"7", "13"};
  for (int r = 0; r < 2; ++r) {
    commands.push_back(with(mnist_args(dir.path(), dir / "save"),
                            {"--fp16", "--fp16-init-scale", "1073741824", "--fp16-scale-window", "4",
                             "--max-sentences", batch[r], "--max-update", "12", "--distributed-world-size", "2",
                             "--distributed-rank", std::to_string(r), "--distributed-init-method",
                             "file://" + (dir / "rendezvous"), "--log-all-ranks"}));
  }
  const auto results = run_processes(commands, 300s);
  for (int r = 0; r < 2; ++r) require_success(results[r], "rank " + std::to_string(r));
  const auto rank0 = overflow_lines(results[0].err), rank1 = overflow_lines(results[1].err);
  INFO("rank 0 stderr:\n" << results[0].err);
  CHECK(rank0.size() >= 10);  // at least 2^30 -> 2^20 before float16 holds the gradients
  CHECK(rank0 == rank1);
  CHECK_THAT(results[0].err, Contains("[fp16] float16 forward passes") && Contains("doubled after 4 updates"));
  for (const auto& r : results) CHECK_THAT(r.err, Contains("done: 12 updates"));

  const auto ck = hetseq::load_checkpoint(dir / "save/checkpoint_last.pt");
  CHECK(ck.num_updates == 12);
  REQUIRE(ck.loss_scaler.count("scale"));
  CHECK(ck.loss_scaler.at("overflows") == static_cast<double>(rank0.size()));
  // One line per applied update (none for skipped ones), with finite statistics; the logged scale of
  // the last update is the saved one.
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

TEST_CASE("an fp16 run stopped and resumed is bit-identical to the run never stopped, loss scale included",
          "[precision][resume]") {
  TempDir dir;
  write_random_mnist(dir.path(), 300, 20, 4);
  // Window 2 and a start scale that overflows: the scale moves up and down through the run.
  auto run = [&](const std::string& save_dir, int updates) {
    return run_process(with(mnist_args(dir.path(), save_dir),
                            {"--fp16", "--fp16-init-scale", "1048576", "--fp16-scale-window", "2", "--max-sentences",
                             "8", "--max-update", std::to_string(updates)}),
                       300s);
  };
  const auto straight = run(dir / "straight", 9);
  require_success(straight, "uninterrupted run");
  const auto first = run(dir / "resumed", 4);
  require_success(first, "run stopped after update 4");
  const double saved_scale = hetseq::load_checkpoint(dir / "resumed/checkpoint_last.pt").loss_scaler.at("scale");
  const auto second = run(dir / "resumed", 9);
  require_success(second, "resumed run");
  CHECK_THAT(second.err, Contains(fmt::format("[fp16] loss scale {} from {}", saved_scale,
                                              dir / "resumed/checkpoint_last.pt")));
  CHECK(!overflow_lines(straight.err).empty());

  const auto a = hetseq::load_checkpoint(dir / "straight/checkpoint_last.pt");
  const auto b = hetseq::load_checkpoint(dir / "resumed/checkpoint_last.pt");
  CHECK(a.num_updates == 9);
  CHECK(b.num_updates == 9);
  CHECK(a.offset == b.offset);
  CHECK(a.loss_scaler == b.loss_scaler);
  REQUIRE(a.model.size() == b.model.size());
  for (size_t i = 0; i < a.model.size(); ++i) {
    INFO(a.model[i].first);
    CHECK(torch::equal(a.model[i].second, b.model[i].second));
  }
  CHECK(hetseq::state_digest(a) == hetseq::state_digest(b));
}

TEST_CASE("bf16 trains Fashion-MNIST on the CPU and validates", "[precision][cli]") {
  TempDir dir;
  // The first 2000 training and 1000 test samples: bf16 is slow on a CPU without bf16 instructions,
  // and a full 10000-sample validation took most of this test's time.
  // 24 updates and 500 test samples (about half of the 45 s that 40 updates and 1000 took): Adam's first updates
  // already take Fashion-MNIST far above chance.
  write_mnist_prefix(fashion_mnist_dir(), dir.path(), 2000, 500);
  const auto r = run_process({binary_path("hetseq-train"), "--task", "mnist", "--data", dir.path(), "--cpu", "--bf16", "--max-sentences", "32",
                              "--optimizer", "adam", "--lr", "0.001", "--max-update", "24", "--log-format", "json",
                              "--log-interval", "8", "--save-dir", dir / "save", "--max-sentences-valid", "500"},
                             300s);
  require_success(r, "bf16 run");
  CHECK_THAT(r.err, Contains("[bf16] bfloat16 forward passes"));
  const auto train = json_lines(r.out, "train");
  REQUIRE(train.size() == 3);
  CHECK(!train.back().contains("loss_scale"));
  CHECK(train.back()["loss"].get<double>() < train.front()["loss"].get<double>());
  const auto valid = json_lines(r.out, "valid");
  REQUIRE(valid.size() == 1);
  CHECK(valid[0]["accuracy"].get<double>() > 30.0);  // chance is 10%
}
