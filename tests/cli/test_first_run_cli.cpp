// What a new user meets on a first run of hetseq-train: a mistyped flag named with the nearest known one, a
// random port that other commands' ranks could never reach refused at once, and a run without --cpu on a
// machine without a visible GPU that says it trains on the CPU.
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "hetseq/cli/device_notice.h"
#include "hetseq/cli/nearest_flag.h"
#include "support/mnist_files.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// Lines of `text` (stderr) that contain `part`.
size_t lines_with(const std::string& text, const std::string& part) {
  size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.find(part) != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("the nearest known flags: a letter missing, doubled or swapped, and nothing for an unrelated name",
          "[cli][flags]") {
  using hetseq::cli::nearest_flags;
  const std::vector<std::string> known{"max-sentences", "max-sentences-valid", "max-epoch", "max-update", "lr",
                                       "lr_scheduler", "update-freq", "seed"};
  CHECK(hetseq::cli::flag_edit_distance("max-sentence", "max-sentences") == 1);
  CHECK(hetseq::cli::flag_edit_distance("update-frqe", "update-freq") == 1);  // a swap counts one
  CHECK(nearest_flags("max-sentence", known) == std::vector<std::string>{"max-sentences"});
  CHECK(nearest_flags("max-epochs", known) == std::vector<std::string>{"max-epoch"});
  CHECK(nearest_flags("update-frqe", known) == std::vector<std::string>{"update-freq"});
  CHECK(nearest_flags("sed", known) == std::vector<std::string>{"seed"});
  CHECK(nearest_flags("epochs", known).empty());
  CHECK(nearest_flags("gpus", known).empty());
}

TEST_CASE("an unknown flag exits 2 with one line naming the nearest known flag", "[cli][flags]") {
  {
    const ProcessResult r = run_hetseq_train({"--task", "mnist", "--max-sentence", "64"});
    CHECK(r.exit_code == 2);
    CHECK(r.err ==
          "hetseq-train: error: unknown flag --max-sentence; did you mean --max-sentences? (see --help)\n");
  }
  {
    const ProcessResult r = run_hetseq_train({"--task", "mnist", "--max-sentences", "64", "--lr-shceduler=fixed"});
    CHECK(r.exit_code == 2);
    CHECK(r.err == "hetseq-train: error: unknown flag --lr-shceduler; did you mean --lr_scheduler? (see --help)\n");
  }
  {
    const ProcessResult r = run_hetseq_train({"--task", "mnist", "--max-sentences", "64", "--epochs", "3"});
    CHECK(r.exit_code == 2);
    CHECK(r.err == "hetseq-train: error: unknown flag --epochs (see --help)\n");
  }
}

TEST_CASE("tcp://HOST:0 for a world larger than this command's workers exits 2 at once with one line",
          "[cli][world]") {
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult r = run_process({binary_path("hetseq-train"), "--task", "mnist", "--max-sentences", "64", "--cpu",
                                       "--distributed-world-size", "2", "--distributed-init-method",
                                       "tcp://127.0.0.1:0"},
                                      60s);
  CHECK(std::chrono::steady_clock::now() - start < 30s);  // not the rendezvous timeout (300 s)
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "hetseq-train: error: --distributed-init-method tcp://127.0.0.1:0: port 0 picks a random port that only the "
        "workers this command starts can learn, but this command starts rank(s) 0..0 of --distributed-world-size 2; "
        "give a fixed port that every node reaches (e.g. tcp://127.0.0.1:29500), or start all 2 workers from this "
        "command (--distributed-gpus 2)\n");
}

TEST_CASE("the CPU warning names what was looked for, and only when no CUDA device is visible without --cpu",
          "[cli][device]") {
  using hetseq::cli::cpu_fallback_warning;
  CHECK(cpu_fallback_warning(false, 0, {}, true) ==
        "[train] no CUDA device visible (CUDA_VISIBLE_DEVICES unset, torch::cuda::device_count() == 0): training on "
        "the CPU; pass --cpu to silence this");
  CHECK(cpu_fallback_warning(false, 0, {{"CUDA_VISIBLE_DEVICES", "2,3"}}, false) ==
        "[train] no CUDA device visible (CUDA_VISIBLE_DEVICES='2,3', torch::cuda::device_count() == 0, this LibTorch "
        "is built without CUDA): training on the CPU; pass --cpu to silence this");
  CHECK_FALSE(cpu_fallback_warning(true, 0, {}, false));
  CHECK_FALSE(cpu_fallback_warning(false, 2, {}, true));
}

TEST_CASE("a run without --cpu where no GPU is visible warns once that it trains on the CPU, and --cpu silences it",
          "[cli][device][installed-data]") {
  const std::string data = fashion_mnist_prefix(64, 32);
  TempDir dir;
  const std::vector<std::string> run{binary_path("hetseq-train"), "--task", "mnist", "--data", data,
                                     "--max-sentences", "32", "--max-update", "1", "--disable-validation", "--no-save",
                                     "--log-format", "none", "--num-workers", "0", "--save-dir", dir.path()};
  // CUDA_VISIBLE_DEVICES='' hides every GPU, so the run is the same on a machine that has one.
  const std::map<std::string, std::string> no_gpu{{"CUDA_VISIBLE_DEVICES", ""}};
  {
    const ProcessResult r = run_process(run, 120s, no_gpu);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(lines_with(r.err, "no CUDA device visible") == 1);
    CHECK_THAT(r.err, Contains("[train] no CUDA device visible (CUDA_VISIBLE_DEVICES='', "
                               "torch::cuda::device_count() == 0") &&
                          Contains("): training on the CPU; pass --cpu to silence this"));
  }
  {
    std::vector<std::string> cpu = run;
    cpu.push_back("--cpu");
    const ProcessResult r = run_process(cpu, 120s, no_gpu);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(lines_with(r.err, "no CUDA device visible") == 0);
  }
}
