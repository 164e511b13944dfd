// hetseq-fuzz-seeds: writes the seed corpora of the fuzz harnesses (fuzz/corpus/<harness>/) and the dictionary of
// hetseq-train's flags (fuzz/train_flags.dict). See Note [Fuzz harnesses].
//
//   hetseq-fuzz-seeds FUZZ_DIR      (FUZZ_DIR: the fuzz/ folder of the checkout)
//
// Seeds are small and real: files written by the same code (or test helper) that writes them for hetseq, named
// valid-* (which the replay tests require to be accepted), and a few broken ones, named bad-*, one per way a file
// goes wrong. Run it again when a format changes (a valid-* seed that is rejected fails its replay test); it
// overwrites its own files and leaves the others (inputs found by fuzzing) alone.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bert/shard_writer.h"
#include "fuzz/checkpoint_input.h"
#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/cli/train_options.h"

namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<char>;

void write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) throw std::runtime_error("cannot write " + path.string());
  std::cout << path.string() << " (" << bytes.size() << " bytes)\n";
}

void write_text(const fs::path& path, const std::string& text) { write_file(path, Bytes(text.begin(), text.end())); }

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Bytes gzipped(const Bytes& bytes) {
  const fs::path tmp = fs::temp_directory_path() / ("hetseq-fuzz-seeds-" + std::to_string(::getpid()) + ".gz");
  gzFile file = gzopen(tmp.c_str(), "wb9");
  if (file == nullptr || gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) != int(bytes.size()) ||
      gzclose(file) != Z_OK) {
    throw std::runtime_error("cannot gzip into " + tmp.string());
  }
  Bytes out = read_file(tmp);
  std::remove(tmp.c_str());  // not fs::remove: see tests/support/temp_dir.cpp
  return out;
}

Bytes prefix(const Bytes& bytes, size_t n) { return Bytes(bytes.begin(), bytes.begin() + std::min(n, bytes.size())); }

Bytes flipped(Bytes bytes, size_t at) {
  bytes.at(at) = static_cast<char>(bytes.at(at) ^ 0x40);
  return bytes;
}

// IDX files (see Note [IDX format]).
Bytes idx(uint32_t magic, const std::vector<uint32_t>& sizes, size_t data_bytes) {
  Bytes out;
  auto put = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
  };
  put(magic);
  for (uint32_t s : sizes) put(s);
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i * 37 % 256));
  return out;
}

void write_idx_seeds(const fs::path& dir) {
  const Bytes images = idx(0x803, {2, 3, 4}, 24), labels = idx(0x801, {5}, 5);
  write_file(dir / "valid-images", images);
  write_file(dir / "valid-labels", labels);
  write_file(dir / "valid-images.gz", gzipped(images));
  write_file(dir / "valid-labels.gz", gzipped(labels));
  write_file(dir / "valid-images-empty", idx(0x803, {0, 28, 28}, 0));
  write_file(dir / "bad-empty", {});
  write_file(dir / "bad-header-truncated", prefix(images, 9));
  write_file(dir / "bad-data-truncated", prefix(images, images.size() - 1));
  Bytes trailing = labels;
  trailing.push_back(0);
  write_file(dir / "bad-trailing-byte", trailing);
  write_file(dir / "bad-magic", idx(0x12340803, {2, 3, 4}, 24));
  write_file(dir / "bad-element-type", idx(0x0d03, {2, 3, 4}, 24));
  write_file(dir / "bad-huge-dimensions", idx(0x803, {0xffffffff, 0xffffffff, 0xffffffff}, 16));
  write_file(dir / "bad-gzip-truncated.gz", prefix(gzipped(images), 20));
  const Bytes gz = gzipped(labels);
  write_file(dir / "bad-gzip-corrupt.gz", flipped(gz, gz.size() - 6));
}

// BERT shards, written by the tests' shard writer.
void write_shard_seeds(const fs::path& dir) {
  using hetseq::test::make_shard;
  using hetseq::test::write_shard;
  auto shard_bytes = [&](const std::map<std::string, hetseq::test::ShardArray>& datasets) {
    const fs::path tmp = fs::temp_directory_path() / ("hetseq-fuzz-seeds-" + std::to_string(::getpid()) + ".h5");
    write_shard(tmp.string(), datasets);
    Bytes out = read_file(tmp);
    std::remove(tmp.c_str());  // not fs::remove: see tests/support/temp_dir.cpp
    return out;
  };
  const auto shard = make_shard(3, 8, 2);
  const Bytes valid = shard_bytes(shard);
  write_file(dir / "valid-shard.h5", valid);
  auto labels_2d = shard;
  labels_2d["next_sentence_labels"].shape = {3, 1};
  write_file(dir / "valid-shard-labels-2d.h5", shard_bytes(labels_2d));
  auto compressed = make_shard(6, 8, 2);  // two chunks per dataset
  for (auto& [name, array] : compressed) array.gzip = true;
  write_file(dir / "valid-shard-gzip.h5", shard_bytes(compressed));
  auto floats = shard;
  floats["input_mask"].as_float = true;
  write_file(dir / "bad-float-dataset.h5", shard_bytes(floats));
  auto missing = shard;
  missing.erase("masked_lm_ids");
  write_file(dir / "bad-missing-dataset.h5", shard_bytes(missing));
  auto mismatch = shard;
  mismatch["segment_ids"] = make_shard(3, 6, 2)["segment_ids"];
  write_file(dir / "bad-shape-mismatch.h5", shard_bytes(mismatch));
  write_file(dir / "bad-truncated.h5", prefix(valid, valid.size() / 2));
  write_file(dir / "bad-not-hdf5.h5", Bytes(64, 'x'));
}

// Checkpoints, written by encode_checkpoint; both kinds of input (see Note [Checkpoint fuzz inputs]).
hetseq::Checkpoint small_checkpoint() {
  torch::manual_seed(3);
  hetseq::Checkpoint c;
  c.model = {{"fc.weight", torch::randn({2, 3})}, {"fc.bias", torch::randn({2})},
             {"bn.num_batches_tracked", torch::tensor(4, torch::kInt64)}};
  c.optimizer_name = "adam";
  c.optimizer_options = {{"beta1", 0.9}, {"beta2", 0.98}, {"eps", 1e-8}};
  c.optimizer_state = std::map<std::string, torch::Tensor>{{"param.0.exp_avg", torch::randn({2, 3})},
                                                           {"step", torch::tensor(2.0, torch::kFloat64)}};
  c.loss_scaler = {{"scale", 128.0}};
  c.lr_scheduler_name = "PolynomialDecayScheduler";
  c.lr_scheduler_state = {{"lr", 0.01}};
  c.num_updates = 7;
  c.epoch = 2;
  c.offset = 40;
  c.meters = {{"loss.sum", 3.5}};
  c.rng_state = torch::arange(16, torch::kUInt8);
  c.best = 0.5;
  c.data_plan = {{4, 2}, {1, 2}, {5, 3}};
  c.bucket_layout = {{0, 1}, {2}};
  c.task = "mnist";
  c.model_digest = "fc.weight[2,3];fc.bias[2]";
  c.options = "--seed=1";
  return c;
}

void write_checkpoint_seeds(const fs::path& dir) {
  const hetseq::Checkpoint full = small_checkpoint();
  hetseq::Checkpoint minimal;
  minimal.model = {{"w", torch::ones({2})}};
  minimal.optimizer_name = "sgd";
  minimal.lr_scheduler_name = "fixed";
  minimal.task = "mnist";
  const Bytes full_bytes = hetseq::encode_checkpoint(full), minimal_bytes = hetseq::encode_checkpoint(minimal);
  write_file(dir / "valid-full.pt", full_bytes);
  write_file(dir / "valid-minimal.pt", minimal_bytes);
  const std::string full_records = hetseq::fuzz::records_input_of(full_bytes);
  write_text(dir / "valid-records-full", full_records);
  write_text(dir / "valid-records-minimal", hetseq::fuzz::records_input_of(minimal_bytes));
  write_file(dir / "bad-empty.pt", {});
  write_file(dir / "bad-truncated.pt", prefix(full_bytes, full_bytes.size() / 2));
  write_file(dir / "bad-altered-byte.pt", flipped(full_bytes, full_bytes.size() / 3));
  // A records input with a flipped bit in its last storage: the archive's CRCs are right, the checksum catches it.
  std::string altered = full_records;
  altered[altered.size() - 3] = static_cast<char>(altered[altered.size() - 3] ^ 0x40);
  write_text(dir / "bad-records-checksum", altered);
  hetseq::Checkpoint future = minimal;
  // Version 2 is a sharded checkpoint's; this one has no shards (earlier seeds: a version from the future).
  future.format_version = hetseq::Checkpoint::kShardedFormatVersion;
  write_file(dir / "bad-format-version.pt", hetseq::encode_checkpoint(future));
}

// Command lines of hetseq-train, one argument per line.
void write_flag_seeds(const fs::path& dir) {
  const std::map<std::string, std::string> seeds{
      {"valid-mnist", "--task\nmnist\n--max-sentences\n32"},
      {"valid-help", "--task\nbert\n--help"},
      {"valid-aliases", "--task=mnist\n--batch-size=16,8\n--learning-rate\n0.1\n--lr-scheduler\nfixed\n--me\n3\n"
                        "--local_rank\n1\n--wd\n0.01"},
      {"valid-schedule", "--task\nmnist\n--max-sentences\n8\n--optimizer\nadam\n--adam-betas\n(0.9, 0.98)\n--lr\n"
                         "[0.1,0.05]\n--update-freq\n1,2,4\n--lr_scheduler\nPolynomialDecayScheduler\n"
                         "--warmup-updates\n10\n--total-num-update\n1000\n--clip-norm\n0\n--min-lr\n1e-9"},
      {"valid-distributed", "--task\nmnist\n--max-sentences\n64,32\n--distributed-world-size\n3\n"
                            "--distributed-rank\n1\n--distributed-init-method\ntcp://[::1]:23456\n"
                            "--distributed-backend\ngloo\n--distributed-gpus\n2\n--bucket-cap-mb\n0.5\n"
                            "--ddp-comm-hook\npowersgd\n--powersgd-rank\n2\n--broadcast-buffers=false\n"
                            "--distributed-timeout\n30\n--fast-stat-sync"},
      {"valid-balance-fp16", "--task\nmnist\n--max-sentences\n16\n--auto-balance\n--balance-interval\n5\n"
                             "--balance-threshold\n0.1\n--balance-cap\n12,8\n--fp16\n--fp16-init-scale\n1024\n"
                             "--fp16-scale-window\n50\n--threshold-loss-scale\n1"},
      {"valid-checkpoint-observe", "--task\nmnist\n--max-sentences\n4\n--save-dir\n/tmp/x\n--restore-file\n"
                                   "a.pt\n--optimizer-overrides\nbeta2=0.98,lr=0.1\n--keep-last-epochs\n2\n"
                                   "--save-interval-updates\n100\n--trace-dir\n/tmp/t\n--trace-updates\n3:9\n"
                                   "--trace-ops\n--json-log\n/tmp/log.jsonl\n--log-format\njson\n"
                                   "--valid-subset\nvalid,test\n--distributed-init-method\nenv://"},
      {"bad-no-task", "--max-sentences\n32"},
      {"bad-unknown-flag", "--task\nmnist\n--max-sentences\n32\n--no-such-flag"},
      {"bad-number", "--task\nmnist\n--max-sentences\n32\n--lr\n0.1x"},
      {"bad-fp16-bf16", "--task\nmnist\n--max-sentences\n32\n--fp16\n--bf16"},
      {"bad-positional", "--task\nmnist\nextra\n--max-sentences\n32"},
      {"bad-trace-window", "--task\nmnist\n--max-sentences\n32\n--trace-updates\n9:3"},
  };
  for (const auto& [name, text] : seeds) write_text(dir / name, text);
}

/// libFuzzer's dictionary for the command-line harness: every flag of hetseq-train, bare and with '='.
void write_flag_dictionary(const fs::path& path) {
  const cxxopts::Options parser = hetseq::cli::make_train_parser(std::nullopt);
  std::set<std::string> names;
  for (const auto& group : parser.groups()) {
    for (const auto& option : parser.group_help(group).options) {
      for (const auto& l : option.l) names.insert(l);
    }
  }
  std::string text = "# Flags of hetseq-train, written by hetseq-fuzz-seeds (fuzz/write_seeds.cpp).\n";
  for (const std::string& n : names) text += "\"--" + n + "\"\n\"--" + n + "=\"\n";
  for (const char* token : {"\\x0a", ",", ":", "(", ")", "[", "]", "=", "-1", "0", "1e308", "nan", "inf", "true",
                            "false", "mnist", "bert", "tcp://", "file:///", "env://"}) {
    text += std::string("\"") + token + "\"\n";
  }
  write_text(path, text);
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc != 2) {
    std::cerr << "usage: hetseq-fuzz-seeds FUZZ_DIR   (the fuzz/ folder of the checkout)\n";
    return 2;
  }
  try {
    const fs::path root = argv[1];
    const std::map<std::string, void (*)(const fs::path&)> corpora{{"idx_reader", write_idx_seeds},
                                                                  {"bert_shard", write_shard_seeds},
                                                                  {"checkpoint", write_checkpoint_seeds},
                                                                  {"train_flags", write_flag_seeds}};
    for (const auto& [name, write] : corpora) {
      fs::create_directories(root / "corpus" / name);
      write(root / "corpus" / name);
    }
    write_flag_dictionary(root / "train_flags.dict");
  } catch (const std::exception& e) {
    std::cerr << "hetseq-fuzz-seeds: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
