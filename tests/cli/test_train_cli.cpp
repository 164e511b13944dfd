// hetseq-train as a user meets it: real processes, real files, exit codes and messages.
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "hetseq/core/error.h"
#include "support/mnist_files.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

using namespace hetseq::test;
namespace fs = std::filesystem;

namespace {

const std::string kData = fashion_mnist_dir();

std::vector<nlohmann::json> all_json_lines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

}  // namespace

TEST_CASE("malformed flags and invalid combinations exit 2 with one clear line", "[cli]") {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases{
      {{"--task", "mnist"}, "--max-sentences"},
      {{"--task", "mnist", "--max-sentences", "-4"}, "--max-sentences"},
      {{"--task", "mnist", "--max-sentences", "64", "--update-freq", "0"}, "--update-freq"},
      {{"--task", "mnist", "--max-sentences", "64", "--lr", "fast"}, "--lr"},
      {{"--task", "mnist", "--max-sentences", "64", "--adam-betas", "(0.9, 0.999"}, "--adam-betas"},
      {{"--task", "mnist", "--max-sentences", "64", "--adam-betas", "0.9"}, "--adam-betas"},
      {{"--task", "mnist", "--max-sentences", "64", "--clip-norm", "-1"}, "--clip-norm"},
      {{"--task", "mnist", "--max-sentences", "64", "--bucket-cap-mb", "0"},
       "--bucket-cap-mb: 0 is not a positive number of MiB"},
      {{"--task", "mnist", "--max-sentences", "64", "--max-epoch", "-1"}, "--max-epoch"},
      {{"--task", "mnist", "--max-sentences", "64", "--log-format", "xml"}, "--log-format"},
      {{"--task", "mnist", "--max-sentences", "64", "--optimizer", "lamb"}, "--optimizer"},
      {{"--task", "mnist", "--max-sentences", "64", "--lr_scheduler", "cosine"}, "--lr_scheduler"},
      {{"--task", "mnist", "--max-sentences", "64", "--no-such-flag", "1"}, "no-such-flag"},
      {{"--task", "mnist", "--max-sentences", "64", "stray"}, "stray"},
      {{"--task", "mnist", "--max-sentences", "64", "--dropout", "0.5"}, "--dropout"},
      {{"--task", "mnist", "--max-sentences", "64", "--fp16", "--bf16"}, "--bf16"},
      {{"--task", "mnist", "--max-sentences", "64", "--fp16", "--fp16-init-scale", "100"}, "--fp16-init-scale"},
      {{"--task", "mnist", "--max-sentences", "64", "--fp16-init-scale", "64"}, "--fp16-init-scale"},
      {{"--task", "mnist", "--max-sentences", "64", "--fp16", "--fp16-scale-window", "0"}, "--fp16-scale-window"},
      {{"--task", "mnist", "--max-sentences", "64", "--fp16", "--threshold-loss-scale", "3"}, "--threshold-loss-scale"},
      {{"--task", "mnist", "--max-sentences", "64", "--fp16", "--fp16-scale-tolerance", "1.5"},
       "--fp16-scale-tolerance"},
      {{"--task", "nope", "--max-sentences", "64"}, "--task"},
      {{"--max-sentences", "64"}, "--task"},
  };
  for (const auto& c : cases) {
    INFO(fmt::format("{}", fmt::join(c.args, " ")));
    const auto r = run_hetseq_train(c.args);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("error:") && Catch::Contains(c.message));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

TEST_CASE("hetseq-train --help lists HetSeq's flag groups and exits 0", "[cli]") {
  const auto r = run_hetseq_train({"--help"});
  CHECK(r.exit_code == 0);
  for (const char* s : {"--max-sentences", "--update-freq", "--adam-betas", "--lr_scheduler", "--save-dir",
                        "Dataset and data loading", "Optimization", "Checkpointing", "--dropout"}) {
    CHECK_THAT(r.out, Catch::Contains(s));
  }
}

TEST_CASE("bad input names the path, exits non-zero and writes nothing", "[cli][installed-data]") {
  TempDir dir;
  const std::string save = dir / "save";
  SECTION("missing data directory") {
    const auto r =
        run_hetseq_train({"--task", "mnist", "--data", dir / "nowhere", "--max-sentences", "64", "--save-dir", save});
    CHECK(r.exit_code == hetseq::kExitInput);
    CHECK_THAT(r.err, Catch::Contains("nowhere"));
    CHECK(!fs::exists(fs::path(save) / "checkpoint_last.pt"));
  }
  SECTION("corrupt IDX file") {
    const std::string data = dir / "data";
    fs::create_directories(data);
    for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      fs::copy_file(fs::path(kData) / f, fs::path(data) / f);
    }
    std::ofstream(fs::path(data) / "train-images-idx3-ubyte") << "this is not an IDX file at all";
    const auto r = run_hetseq_train({"--task", "mnist", "--data", data, "--max-sentences", "64", "--save-dir", save});
    CHECK(r.exit_code == hetseq::kExitInput);
    CHECK_THAT(r.err, Catch::Contains("train-images-idx3-ubyte"));
    CHECK(!fs::exists(fs::path(save) / "checkpoint_last.pt"));
  }
  SECTION("unwritable --save-dir") {
    const std::string file = dir / "a-file";
    std::ofstream(file) << "x";
    const auto r = run_hetseq_train({"--task", "mnist", "--max-sentences", "64", "--save-dir", file + "/sub"});
    CHECK(r.exit_code == hetseq::kExitInput);
    CHECK_THAT(r.err, Catch::Contains("--save-dir") && Catch::Contains("a-file"));
  }
}

TEST_CASE("a short run trains, validates, logs JSON and saves a model that hetseq-eval reads", "[cli][train]") {
  TempDir dir;
  // The first 2000 training and 1000 test images of the shipped Fashion-MNIST: real data, and a run
  // whose time goes into the plumbing under test rather than into loading 60k images and evaluating 10k.
  fs::create_directories(dir / "data");
  write_mnist_prefix(kData, dir / "data", 2000, 1000);
  const auto r = run_hetseq_train({"--task", "mnist", "--data", dir / "data", "--max-sentences", "32", "--optimizer",
                                   "adam", "--lr", "0.001", "--max-update", "40", "--log-format", "json",
                                   "--log-interval", "10", "--save-dir", dir / "save", "--num-workers", "2",
                                   "--max-sentences-valid", "500"});
  REQUIRE(r.exit_code == 0);
  const auto lines = all_json_lines(r.out);
  std::vector<nlohmann::json> train_lines, valid_lines, epoch_lines;
  for (const auto& j : lines) {
    if (j["tag"] == "train") train_lines.push_back(j);
    if (j["tag"] == "valid") valid_lines.push_back(j);
    if (j["tag"] == "train_epoch") epoch_lines.push_back(j);
  }
  REQUIRE(train_lines.size() == 4);
  for (const char* key : {"loss", "nll_loss", "ppl", "wps", "ups", "wpb", "bsz", "gnorm", "clip", "lr",
                          "num_updates", "wall", "train_wall", "epoch"}) {
    CHECK(train_lines.back().contains(key));
  }
  CHECK(train_lines.back()["num_updates"] == 40);
  CHECK(train_lines.back()["bsz"] == 32);
  CHECK(train_lines.back()["loss"].get<double>() < train_lines.front()["loss"].get<double>());
  REQUIRE(epoch_lines.size() == 1);
  REQUIRE(valid_lines.size() == 1);
  CHECK(valid_lines[0]["subset"] == "test");
  const double accuracy = valid_lines[0]["accuracy"].get<double>();
  CHECK(accuracy > 30.0);  // 40 updates of 32 samples: far above chance (10%)

  const auto e = run_process({binary_path("hetseq-eval"), "--task", "mnist", "--data", dir / "data", "--path",
                              dir / "save/checkpoint_last.pt", "--valid-subset", "test", "--log-format", "json",
                              "--max-sentences", "1000"},
                             std::chrono::seconds(120));
  REQUIRE(e.exit_code == 0);
  const auto eval_lines = all_json_lines(e.out);
  REQUIRE(eval_lines.size() == 1);
  CHECK(eval_lines[0]["accuracy"].get<double>() == Approx(accuracy).margin(1e-9));

  // hetseq-eval --bf16: the same model under bfloat16 autocast: a loss that differs by rounding only. On the
  // first 200 test images, against float32 on the same 200: bf16 autocast on a CPU without bf16 instructions
  // takes about 0.4 s per 32 samples, and all 1000 took 12 s of this test.
  fs::create_directories(dir / "data200");
  write_mnist_prefix(kData, dir / "data200", 32, 200);
  auto eval200 = [&](bool bf16) {
    std::vector<std::string> args = {binary_path("hetseq-eval"), "--task", "mnist", "--data", dir / "data200", "--path",
                                     dir / "save/checkpoint_last.pt", "--valid-subset", "test", "--log-format", "json",
                                     "--max-sentences", "200"};
    if (bf16) args.push_back("--bf16");
    const auto p = run_process(args, std::chrono::seconds(300));
    INFO(p.err);
    REQUIRE(p.exit_code == 0);
    const auto lines = all_json_lines(p.out);
    REQUIRE(lines.size() == 1);
    return lines[0];
  };
  const auto fp32 = eval200(false), bf16 = eval200(true);
  const double fp32_loss = fp32["loss"].get<double>(), bf16_loss = bf16["loss"].get<double>();
  CHECK(bf16_loss != fp32_loss);
  CHECK(bf16_loss == Approx(fp32_loss).epsilon(0.02));
  CHECK(bf16["accuracy"].get<double>() == Approx(fp32["accuracy"].get<double>()).margin(3.0));  // 6 of 200 images
}
