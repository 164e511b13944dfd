// hetseq-train --task bert as a user runs it: real processes on HDF5 shards written here.

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "bert/shard_writer.h"
#include "hetseq/core/error.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

using namespace hetseq::test;

namespace {

const std::string kTinyConfig = source_dir() + "/configs/bert-tiny.json";

}  // namespace

// That the loss falls is checked once, by the ctest `bert_trains_from_text` (300 updates on real text);
// this run checks the plumbing: unequal batches on 2 workers, BERT's metrics in the logs, validation.
TEST_CASE("hetseq-train --task bert runs tiny BERT on 2 CPU workers with unequal batches and validates",
          "[bert][cli]") {
  TempDir dir;
  write_shard(dir / "toy_train_0.hdf5", make_shard(48, 16, 4));
  write_shard(dir / "toy_train_1.hdf5", make_shard(24, 16, 4));  // 72 sequences: 3 updates of 24 an epoch
  // 24 test sequences: both ranks get some (with --fast-stat-sync every rank must report the same names).
  write_shard(dir / "toy_test_0.hdf5", make_shard(24, 16, 4));
  const auto r = run_hetseq_train(
      {"--task", "bert", "--data", dir.path(), "--config_file", kTinyConfig, "--cpu", "--distributed-world-size", "2",
       "--distributed-gpus", "2", "--distributed-init-method", "tcp://127.0.0.1:0", "--max-sentences", "8,4",
       "--update-freq", "2", "--optimizer", "adam", "--lr", "0.002", "--warmup-updates", "2", "--total-num-update",
       "40", "--max-update", "6", "--weight-decay", "0.01", "--fast-stat-sync", "--valid-subset", "test",
       "--num-workers", "2", "--log-format", "json", "--log-interval", "4", "--save-dir", dir / "save"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto steps = json_lines(r.out, "train_epoch");
  const auto valid = json_lines(r.out, "valid");
  REQUIRE(steps.size() == 2);
  CHECK(steps.back()["num_updates"] == 6);
  CHECK(steps.back()["bsz"] == 24);  // (8 + 4) sequences x update-freq 2
  for (const auto& step : steps) CHECK(std::isfinite(step["loss"].get<double>()));
  for (const char* key : {"mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "ppl"}) CHECK(steps.back().contains(key));
  REQUIRE(!valid.empty());
  CHECK(valid.back()["subset"] == "test");
  CHECK(valid.back().contains("mlm_accuracy"));
}

TEST_CASE("hetseq-train --task bert: a malformed shard is one line naming the file and the dataset", "[bert][cli]") {
  TempDir dir;
  auto shard = make_shard(8, 16, 4);
  shard.erase("masked_lm_ids");
  write_shard(dir / "toy_train_0.hdf5", shard);
  write_shard(dir / "toy_test_0.hdf5", make_shard(8, 16, 4));
  const auto r = run_hetseq_train({"--task", "bert", "--data", dir.path(), "--config_file", kTinyConfig, "--cpu",
                                   "--max-sentences", "4", "--max-update", "2", "--save-dir", dir / "save"});
  CHECK(r.exit_code == hetseq::kExitInput);
  CHECK_THAT(r.err, Catch::Contains("toy_train_0.hdf5") && Catch::Contains("'masked_lm_ids' is missing"));
  const auto missing_config = run_hetseq_train({"--task", "bert", "--data", dir.path(), "--max-sentences", "4"});
  CHECK(missing_config.exit_code == 2);
  CHECK_THAT(missing_config.err, Catch::Contains("--config_file"));
  TempDir good;
  write_shard(good / "toy_train_0.hdf5", make_shard(8, 16, 4));
  const auto no_split =
      run_hetseq_train({"--task", "bert", "--data", good.path(), "--config_file", kTinyConfig, "--cpu",
                        "--max-sentences", "4", "--valid-subset", "valid", "--save-dir", dir / "save"});
  CHECK(no_split.exit_code == hetseq::kExitInput);
  CHECK_THAT(no_split.err, Catch::Contains("'valid'") && Catch::Contains("--valid-subset"));
}

TEST_CASE("hetseq-train --task bert --init-from loads Hugging Face weights and rejects mismatched ones", "[bert][cli]") {
  TempDir dir;
  write_shard(dir / "toy_train_0.hdf5", make_shard(8, 16, 4));
  write_shard(dir / "toy_test_0.hdf5", make_shard(8, 16, 4));
  // A 1-layer encoder-only checkpoint matching configs/bert-tiny.json except for its number of layers.
  std::map<std::string, torch::Tensor> weights{
      {"embeddings.word_embeddings.weight", torch::full({30522, 128}, 0.01)},
      {"embeddings.position_embeddings.weight", torch::zeros({512, 128})},
      {"embeddings.token_type_embeddings.weight", torch::zeros({2, 128})},
      {"embeddings.LayerNorm.weight", torch::ones({128})},
      {"embeddings.LayerNorm.bias", torch::zeros({128})}};
  std::filesystem::create_directories(dir / "hf");
  write_safetensors(dir / "hf/model.safetensors", weights);
  const std::vector<std::string> base{"--task", "bert", "--data", dir.path(), "--config_file", kTinyConfig, "--cpu",
                                      "--max-sentences", "4", "--max-update", "1", "--no-save", "--init-from"};
  auto with = [&](const std::string& path) {
    auto args = base;
    args.push_back(path);
    return args;
  };
  const auto ok = run_hetseq_train(with(dir / "hf"));
  INFO(ok.err);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.err, Catch::Contains("--init-from") && Catch::Contains("5 tensors loaded"));

  weights["embeddings.position_embeddings.weight"] = torch::zeros({128, 128});
  write_safetensors(dir / "hf/model.safetensors", weights);
  const auto bad = run_hetseq_train(with(dir / "hf"));
  CHECK(bad.exit_code == hetseq::kExitInput);
  CHECK_THAT(bad.err, Catch::Contains("model.safetensors") && Catch::Contains("embeddings.position_embeddings.weight"));
  const auto missing = run_hetseq_train(with(dir / "nowhere"));
  CHECK(missing.exit_code == hetseq::kExitInput);
  CHECK_THAT(missing.err, Catch::Contains("--init-from") && Catch::Contains("nowhere"));
}

// Note [Step profile], as benchmarks/bert_throughput.sh reads it: the JSON line's figures for the timed updates only,
// with no host read in a world of one (Note [Reading an update late]); and --cuda-graph on a CPU rank says in one
// line why it cannot capture and trains on (Note [CUDA-graph updates]), to the same weights' losses as without it.
TEST_CASE("hetseq-train --step-profile measures the steady state, and --cuda-graph on a CPU says why and trains on",
          "[bert][cli]") {
  TempDir dir;
  write_shard(dir / "toy_train_0.hdf5", make_shard(64, 16, 4));
  auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> a{"--task", "bert", "--data", dir.path(), "--config_file", kTinyConfig, "--cpu",
                               "--max-sentences", "8", "--max-update", "7", "--optimizer", "adam", "--lr", "0.001",
                               "--clip-norm", "0.5", "--lr_scheduler", "fixed", "--max_pred_length", "4",
                               "--disable-validation", "--no-save", "--log-format", "json", "--log-interval", "1",
                               "--num-workers", "1", "--intra-op-threads", "1", "--seed", "3"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const auto profiled = run_hetseq_train(args({"--step-profile", "3,4"}));
  INFO(profiled.err);
  REQUIRE(profiled.exit_code == 0);
  const auto profile = json_lines(profiled.out, "step_profile");
  REQUIRE(profile.size() == 1);
  const auto& p = profile.front();
  CHECK(p["warmup_updates"] == 3);
  CHECK(p["timed_updates"] == 4);
  CHECK(p["samples"] == 4 * 8);
  CHECK(p["samples_per_s"].get<double>() > 0);
  CHECK(p["seconds"].get<double>() > 0);
  CHECK(p["samples_per_s"].get<double>() == Approx(32 / p["seconds"].get<double>()));
  CHECK(p["aten_ops_per_update"].get<double>() > 100);  // tiny BERT: hundreds of operators an update
  // --log-interval 1 reads each update's statistics for its line, after the update: no read inside one.
  CHECK(p["host_reads_per_update"] == 0);
  CHECK(p["data_wait_ms"].get<double>() >= 0);
  CHECK(p["host_ms"].get<double>() > 0);
  CHECK(p["device_ms"].get<double>() > 0);
  CHECK(p["peak_memory_bytes"].get<int64_t>() > 0);
  CHECK(p["clock"] == "host clock");

  const auto graphed = run_hetseq_train(args({"--cuda-graph"}));
  INFO(graphed.err);
  REQUIRE(graphed.exit_code == 0);
  CHECK_THAT(graphed.err, Catch::Contains("[cuda-graph] not captured: the rank trains on cpu, and CUDA graphs need a "
                                          "GPU; training goes on uncaptured"));
  // Static shapes (padded masked positions, the mask kept) train to the same losses within float rounding.
  const auto plain = json_lines(profiled.out, "train");
  const auto padded = json_lines(graphed.out, "train");
  REQUIRE(plain.size() == 7);
  REQUIRE(padded.size() == 7);
  for (size_t u = 0; u < plain.size(); ++u) {
    INFO("update " << u + 1);
    CHECK(padded[u]["loss"].get<double>() == Approx(plain[u]["loss"].get<double>()).epsilon(1e-4));
  }

  const auto bad = run_hetseq_train(args({"--step-profile", "0,4"}));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--step-profile") && Catch::Contains("WARMUP >= 1"));
}
