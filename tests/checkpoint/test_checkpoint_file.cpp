// Checkpoint files on disk: a full round trip, truncated and altered files, the strict
// --optimizer-overrides parser, and the file names and retention of CheckpointManager.
#include <filesystem>
#include <fstream>
#include <set>

#include <catch2/catch.hpp>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include "fuzz/checkpoint_input.h"
#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/checkpoint/checkpoint_manager.h"
#include "hetseq/checkpoint/resume_check.h"
#include "hetseq/optim/optimizer_overrides.h"
#include "hetseq/core/error.h"
#include "hetseq/optim/adam.h"
#include "support/error_message.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;
using Catch::Contains;
using hetseq::Checkpoint;
using hetseq::test::TempDir;
using hetseq::test::input_error_of;

namespace {

Checkpoint sample_checkpoint() {
  torch::manual_seed(7);
  Checkpoint c;
  c.model = {{"fc.weight", torch::randn({64, 32})}, {"fc.bias", torch::randn({64})},
             {"bn.running_mean", torch::randn({8})}};
  c.optimizer_name = "adam";
  c.optimizer_options = {{"beta1", 0.9}, {"beta2", 0.98}, {"eps", 1e-8}, {"weight_decay", 0.01}};
  c.optimizer_state = std::map<std::string, torch::Tensor>{{"lr", torch::tensor(0.001, torch::kFloat64)},
                                                           {"param.0.exp_avg", torch::randn({64, 32})}};
  c.lr_scheduler_name = "PolynomialDecayScheduler";
  c.lr_scheduler_state = {{"best", 1.5}};
  c.num_updates = 123;
  c.epoch = 3;
  c.offset = 4567;
  c.meters = {{"loss.sum", 12.5}, {"wall.elapsed_s", 99.0}};
  c.rng_state = torch::randint(0, 255, {5056}, torch::kUInt8);
  c.best = 0.75;
  c.data_plan = {{7, 13, 29}, {1, 3, 2}};
  c.task = "mnist";
  c.model_digest = "abc";
  c.options = "seed=1";
  return c;
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

}  // namespace

TEST_CASE("a checkpoint reads back exactly what was written", "[checkpoint]") {
  TempDir dir;
  const Checkpoint c = sample_checkpoint();
  hetseq::save_checkpoint(c, {dir / "a.pt", dir / "b.pt"});
  const Checkpoint r = hetseq::load_checkpoint(dir / "b.pt");
  REQUIRE(r.model.size() == c.model.size());
  for (size_t i = 0; i < c.model.size(); ++i) {
    CHECK(r.model[i].first == c.model[i].first);
    CHECK(torch::equal(r.model[i].second, c.model[i].second));
  }
  CHECK(r.optimizer_name == "adam");
  CHECK(r.optimizer_options == c.optimizer_options);
  REQUIRE(r.optimizer_state);
  CHECK(torch::equal(r.optimizer_state->at("param.0.exp_avg"), c.optimizer_state->at("param.0.exp_avg")));
  CHECK(r.lr_scheduler_state == c.lr_scheduler_state);
  CHECK(r.num_updates == 123);
  CHECK(r.epoch == 3);
  CHECK(r.offset == 4567);
  CHECK(r.meters == c.meters);
  CHECK(torch::equal(r.rng_state, c.rng_state));
  CHECK(r.best == c.best);
  CHECK(r.data_plan == c.data_plan);
  CHECK(r.task == "mnist");
  CHECK(r.options == "seed=1");
  CHECK(hetseq::state_digest(r) == hetseq::state_digest(c));
  // No temporary files are left behind.
  for (const auto& e : fs::directory_iterator(dir.path())) CHECK(e.path().filename().string()[0] != '.');
}

TEST_CASE("a checkpoint without optimizer state or best metric reads back without them", "[checkpoint]") {
  TempDir dir;
  Checkpoint c = sample_checkpoint();
  c.optimizer_state.reset();
  c.best.reset();
  hetseq::save_checkpoint(c, {dir / "c.pt"});
  const Checkpoint r = hetseq::load_checkpoint(dir / "c.pt");
  CHECK(!r.optimizer_state);
  CHECK(!r.best);
}

// Found by the checkpoint fuzz harness (docs/RELIABILITY.md): encoding a state without a generator state threw a
// c10::Error from the checksum of the undefined tensor.
TEST_CASE("a checkpoint without a generator state encodes and reads back without one", "[checkpoint]") {
  Checkpoint c = sample_checkpoint();
  c.rng_state = torch::Tensor();
  const Checkpoint r = hetseq::decode_checkpoint(hetseq::encode_checkpoint(c), "no-rng.pt");
  CHECK(!r.rng_state.defined());
  CHECK(hetseq::state_digest(r) == hetseq::state_digest(c));
}

// Found by the checkpoint fuzz harness (docs/RELIABILITY.md): a dict with an integer key made the checksum throw
// LibTorch's internal assertion (c10::Error) instead of an InputError. See Note [Unpickled values].
TEST_CASE("a checkpoint holding a key that is not a string or a value of another type is a clear error",
          "[checkpoint]") {
  c10::impl::GenericDict root(c10::AnyType::get(), c10::AnyType::get());
  root.insert("format_version", hetseq::Checkpoint::kFormatVersion);
  root.insert("checksum", int64_t{0});
  c10::impl::GenericDict extra(c10::AnyType::get(), c10::AnyType::get());
  extra.insert(int64_t{7}, "seven");
  root.insert("extra_state", extra);
  CHECK_THAT(input_error_of([&] { hetseq::decode_checkpoint(torch::pickle_save(root), "int-key.pt"); }),
             Contains("int-key.pt") && Contains("the entry 'extra_state' has a key of type Int, not a string"));
  root.insert_or_assign("extra_state", c10::ivalue::Tuple::create({int64_t{1}, int64_t{2}}));
  CHECK_THAT(input_error_of([&] { hetseq::decode_checkpoint(torch::pickle_save(root), "tuple.pt"); }),
             Contains("tuple.pt") && Contains("the entry 'extra_state' holds a value of type Tuple"));
}

TEST_CASE("a checkpoint with optimizer shards is format version 2, an ordinary one 1, and another version is refused",
          "[checkpoint]") {
  Checkpoint c = sample_checkpoint();
  CHECK(hetseq::decode_checkpoint(hetseq::encode_checkpoint(c), "plain.pt").format_version == 1);
  c.optimizer_shards = hetseq::OptimizerShardsRef{"0123456789abcdef", 3};
  const Checkpoint sharded = hetseq::decode_checkpoint(hetseq::encode_checkpoint(c), "sharded.pt");
  CHECK(sharded.format_version == 2);
  REQUIRE(sharded.optimizer_shards);
  CHECK(sharded.optimizer_shards->save_id == "0123456789abcdef");
  // A build that reads only version 1 refuses the sharded file rather than resume without the buffers.
  c.optimizer_shards.reset();
  c.format_version = 3;
  CHECK_THAT(input_error_of([&] { hetseq::decode_checkpoint(hetseq::encode_checkpoint(c), "future.pt"); }),
             Contains("future.pt: checkpoint format version 3, but this hetseq reads versions 1 and 2"));
}

TEST_CASE("truncated checkpoints are clear errors naming the file", "[checkpoint]") {
  TempDir dir;
  const std::vector<char> bytes = hetseq::encode_checkpoint(sample_checkpoint());
  for (const size_t keep : {size_t{0}, size_t{10}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 100,
                            bytes.size() - 1}) {
    CAPTURE(keep);
    const std::string path = dir / "truncated.pt";
    write_bytes(path, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep)));
    CHECK_THAT(input_error_of([&] { hetseq::load_checkpoint(path); }), Contains(path));
  }
  CHECK_THAT(input_error_of([&] { hetseq::load_checkpoint(dir / "missing.pt"); }), Contains("no such checkpoint file"));
}

TEST_CASE("an altered byte in a checkpoint's data is a clear error naming the file", "[checkpoint]") {
  TempDir dir;
  const std::vector<char> bytes = hetseq::encode_checkpoint(sample_checkpoint());
  const std::string path = dir / "flipped.pt";
  // Bytes inside the tensor records (the middle of the file) and at a spread of other places.
  int detected = 0, positions = 0;
  for (size_t pos = 1; pos < bytes.size(); pos += bytes.size() / 37) {
    CAPTURE(pos);
    std::vector<char> altered = bytes;
    altered[pos] = static_cast<char>(altered[pos] ^ 0x04);
    write_bytes(path, altered);
    ++positions;
    try {
      const Checkpoint r = hetseq::load_checkpoint(path);
      // A flip in bytes that carry no content (zip padding) may go unnoticed, but must not change it.
      CHECK(hetseq::state_digest(r) == hetseq::state_digest(sample_checkpoint()));
    } catch (const hetseq::InputError& e) {
      CHECK_THAT(e.what(), Contains(path));
      ++detected;
    }
  }
  INFO(detected << " of " << positions << " flips detected");
  CHECK(detected >= positions * 3 / 4);
  // A flip in the middle, inside the largest tensor, is the checksum's to catch.
  std::vector<char> altered = bytes;
  altered[bytes.size() / 2] = static_cast<char>(altered[bytes.size() / 2] ^ 0x01);
  write_bytes(path, altered);
  const std::string message = input_error_of([&] { hetseq::load_checkpoint(path); });
  CHECK_THAT(message, Contains(path));
}

TEST_CASE("a write over an existing checkpoint replaces it whole and leaves no temporary file", "[checkpoint]") {
  TempDir dir;
  Checkpoint c = sample_checkpoint();
  hetseq::save_checkpoint(c, {dir / "checkpoint_last.pt"});
  c.num_updates = 124;
  hetseq::save_checkpoint(c, {dir / "checkpoint_last.pt"});
  CHECK(hetseq::load_checkpoint(dir / "checkpoint_last.pt").num_updates == 124);
  // A stale temporary file from a killed writer is removed, and only such files.
  write_bytes(dir / ".checkpoint_last.pt.hetseq-tmp-99999", {'x'});
  write_bytes(dir / ".other", {'x'});
  CHECK(hetseq::remove_stale_temporaries(dir.path()) == 1);
  CHECK(fs::exists(dir / ".other"));
  CHECK(fs::exists(dir / "checkpoint_last.pt"));
}

TEST_CASE("optimizer overrides are parsed strictly and applied by name", "[checkpoint]") {
  using hetseq::parse_optimizer_overrides;
  const auto o = parse_optimizer_overrides("beta2=0.98,weight_decay=0.01");
  REQUIRE(o.size() == 2);
  CHECK(o[0] == std::pair<std::string, double>{"beta2", 0.98});
  CHECK(parse_optimizer_overrides("").empty());
  for (const std::string bad : {"beta2", "beta2=", "=1", "beta2=0.9x", "beta2=0.9,beta2=0.8", "__import__('os')=1",
                                "{'lr': [0.1]}", "beta2=nan", "beta2=0.9,"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_optimizer_overrides(bad), hetseq::UsageError);
  }
  torch::Tensor p = torch::zeros({3});
  hetseq::optim::Adam adam({p}, hetseq::optim::AdamOptions{});
  hetseq::apply_optimizer_overrides(adam, parse_optimizer_overrides("beta2=0.98"));
  CHECK(adam.hyperparameters().at("beta2") == 0.98);
  CHECK_THROWS_WITH(hetseq::apply_optimizer_overrides(adam, parse_optimizer_overrides("momentum=0.9")),
                    Contains("--optimizer-overrides") && Contains("beta1, beta2, eps, weight_decay"));
  CHECK_THROWS_WITH(hetseq::apply_optimizer_overrides(adam, parse_optimizer_overrides("beta1=1.5")),
                    Contains("--optimizer-overrides"));
  CHECK(adam.hyperparameters().at("beta1") == 0.9);
}

TEST_CASE("checkpoint names follow HetSeq and retention keeps exactly what the flags say", "[checkpoint]") {
  TempDir dir;
  hetseq::CheckpointSaveOptions o;
  o.save_dir = dir.path();
  o.save_interval_updates = 2;
  o.keep_interval_updates = 2;
  o.keep_last_epochs = 1;
  hetseq::CheckpointManager m(o);
  const Checkpoint c = sample_checkpoint();
  auto save = [&](int64_t epoch, int64_t updates, bool end, std::optional<double> metric) {
    const hetseq::SavePoint p{epoch, updates, end, metric};
    const auto files = m.files_for(p);
    m.record(p);
    m.write(c, files);
    std::set<std::string> names;
    for (const auto& f : files) names.insert(f.filename().string());
    return names;
  };
  CHECK(save(1, 2, false, 3.0) == std::set<std::string>{"checkpoint_1_2.pt", "checkpoint_best.pt", "checkpoint_last.pt"});
  CHECK(save(1, 4, false, 3.5) == std::set<std::string>{"checkpoint_1_4.pt", "checkpoint_last.pt"});
  CHECK(save(1, 5, true, 2.0) == std::set<std::string>{"checkpoint1.pt", "checkpoint_best.pt", "checkpoint_last.pt"});
  CHECK(save(2, 6, false, std::nullopt) == std::set<std::string>{"checkpoint_2_6.pt", "checkpoint_last.pt"});
  CHECK(save(2, 8, false, 2.0) == std::set<std::string>{"checkpoint_2_8.pt", "checkpoint_last.pt"});  // a tie is not better
  CHECK(save(2, 10, true, 2.5) == std::set<std::string>{"checkpoint2.pt", "checkpoint_last.pt"});
  CHECK(m.best() == 2.0);
  std::set<std::string> present;
  for (const auto& e : fs::directory_iterator(dir.path())) present.insert(e.path().filename().string());
  CHECK(present == std::set<std::string>{"checkpoint_2_6.pt", "checkpoint_2_8.pt", "checkpoint2.pt", "checkpoint_best.pt",
                                         "checkpoint_last.pt"});

  hetseq::CheckpointSaveOptions maximize = o;
  maximize.maximize_best_checkpoint_metric = true;
  maximize.no_last_checkpoints = true;
  maximize.no_epoch_checkpoints = true;
  hetseq::CheckpointManager mx(maximize);
  mx.record({1, 5, true, 80.0});
  CHECK(mx.files_for({2, 10, true, 85.0}) == std::vector<fs::path>{fs::path(dir.path()) / "checkpoint_best.pt"});
  CHECK(mx.files_for({2, 10, true, 70.0}).empty());
  maximize.no_save = true;
  CHECK(hetseq::CheckpointManager(maximize).files_for({2, 10, true, 99.0}).empty());
}

TEST_CASE("a checkpoint tensor whose shape reaches past the bytes of its record is an error naming the entry",
          "[checkpoint]") {
  // A fuzzer's finding (docs/RELIABILITY.md): the pickle gives an 8-byte record a view of 904 bytes.
  std::ifstream in(hetseq::test::source_dir() + "/fuzz/corpus/checkpoint/crash-tensor-beyond-storage",
                   std::ios::binary);
  const std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(!input.empty());
  const std::vector<char> bytes =
      hetseq::fuzz::checkpoint_bytes_of_input(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  CHECK_THROWS_WITH(hetseq::decode_checkpoint(bytes, "found.pt"),
                    Catch::StartsWith("found.pt: the tensor '") && Catch::Contains("reaches past the 8 bytes of its record"));
}
