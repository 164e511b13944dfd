// The bert task: registration and flags, the loss and its sample size, the --dict check, and loading
// weights in Hugging Face's layout (--init-from). That tiny BERT learns is checked end to end by the
// ctest `bert_trains_from_text` (scripts/bert_train_check.sh); empty batches never reach a task (the
// Controller runs them, tests/train).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <cxxopts.hpp>
#include <torch/torch.h>

#include "bert/shard_writer.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/task/task_registry.h"
#include "hetseq/train/precision.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"
#include "tasks/bert/bert_config.h"
#include "tasks/bert/bert_dataset.h"
#include "tasks/bert/bert_model.h"
#include "tasks/bert/bert_task.h"
#include "tasks/bert/hf_weights.h"

using hetseq::bert::BertConfig;
using hetseq::bert::BertForPreTrainingImpl;
using hetseq::test::TempDir;

namespace {

const std::string kTaskTinyConfig = hetseq::test::source_dir() + "/configs/bert-tiny.json";

hetseq::FlagValues parse_command_line(std::vector<std::string> args) {
  cxxopts::Options options("hetseq-train", "bert task test");
  options.add_options()("data", "data", cxxopts::value<std::string>())(
      "train-subset", "train split", cxxopts::value<std::string>()->default_value("train"));
  hetseq::cli::add_task_flags(options);
  args.insert(args.begin(), "hetseq-train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return hetseq::cli::flag_values(options.parse(static_cast<int>(argv.size()), argv.data()));
}

std::unique_ptr<hetseq::Task> make_task(const std::vector<std::string>& args) {
  return hetseq::TaskRegistry::global().get("bert").create(parse_command_line(args), hetseq::TaskContext{});
}

/// A data directory with a train shard of 24 and a test shard of 8 sequences.
struct TinyData {
  TempDir dir;
  TinyData() {
    hetseq::test::write_shard(dir / "tiny_train_0.hdf5", hetseq::test::make_shard(24, 16, 4));
    hetseq::test::write_shard(dir / "tiny_test_0.hdf5", hetseq::test::make_shard(8, 16, 4));
  }
};

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

}  // namespace

TEST_CASE("the bert task is registered with HetSeq's flags", "[bert][task]") {
  const hetseq::TaskSpec& spec = hetseq::TaskRegistry::global().get("bert");
  CHECK(spec.defaults.at("valid-subset") == "test");
  cxxopts::Options options("hetseq-train");
  hetseq::cli::add_task_flags(options);
  const std::string help = options.help({"BERT task"});
  for (const char* flag : {"--config_file", "--dict", "--max_pred_length", "--num_file", "--init-from"}) {
    CHECK_THAT(help, Catch::Contains(flag));
  }
  TinyData data;
  CHECK_THROWS_AS(make_task({"--data", data.dir.path()}), hetseq::UsageError);  // no --config_file
  CHECK_THROWS_AS(make_task({"--config_file", kTaskTinyConfig}), hetseq::UsageError);  // no --data
  CHECK_THROWS_WITH(make_task({"--data", data.dir.path(), "--config_file", kTaskTinyConfig, "--max_pred_length", "0"}),
                    Catch::Contains("--max_pred_length"));
  CHECK_THROWS_WITH(make_task({"--data", data.dir.path(), "--config_file", data.dir / "none.json"}),
                    Catch::Contains("--config_file") && Catch::Contains("none.json"));
}

TEST_CASE("bert: --dict is checked against the config's vocab_size", "[bert][task]") {
  TinyData data;
  auto write_vocab = [&](int64_t n) {
    std::ofstream out(data.dir / "vocab.txt");
    for (int64_t i = 0; i < n; ++i) out << "tok" << i << "\n";
    return data.dir / "vocab.txt";
  };
  const std::vector<std::string> base{"--data", data.dir.path(), "--config_file", kTaskTinyConfig, "--dict"};
  auto with = [&](const std::string& dict) {
    auto args = base;
    args.push_back(dict);
    return args;
  };
  // The config's size: no warning. A smaller vocabulary (padded in the config): one warning that says so.
  for (const int64_t tokens : {30522, 30000}) {
    CAPTURE(tokens);
    const std::string vocab = write_vocab(tokens);
    hetseq::log::begin_capture();
    CHECK_NOTHROW(make_task(with(vocab)));
    const std::vector<std::string> lines = hetseq::log::end_capture();
    if (tokens == 30522) {
      CHECK(lines.empty());
    } else {
      REQUIRE(lines.size() == 1);
      CHECK_THAT(lines[0], Catch::EndsWith("[bert] --dict " + vocab +
                                           " has 30000 tokens, vocab_size of --config_file is 30522 (padded vocabulary)"));
    }
  }
  CHECK_THROWS_WITH(make_task(with(write_vocab(30600))),
                    Catch::Contains("--dict") && Catch::Contains("30600 tokens") && Catch::Contains("vocab_size 30522"));
  CHECK_THROWS_WITH(make_task(with(data.dir / "missing.txt")), Catch::Contains("--dict") && Catch::Contains("missing.txt"));
}

TEST_CASE("bert: the loss is the per-sequence MLM mean plus NSP summed over sequences", "[bert][task]") {
  TinyData data;
  auto task = make_task({"--data", data.dir.path(), "--config_file", kTaskTinyConfig});
  torch::manual_seed(1);
  auto model = task->build_model();
  model->eval();
  auto dataset = task->load_dataset("train");
  REQUIRE(dataset->size() == 24);
  hetseq::Batch batch = dataset->collate({0, 1, 2, 3});
  // Give sequence 3 a third masked token, so that per-sequence means differ from a token mean; the batch's
  // masked positions follow (collate finds them on the host).
  batch.fields["masked_lm_labels"][3][5] = 77;
  batch.fields["masked_lm_index"] = hetseq::bert::masked_lm_index(batch.at("masked_lm_labels"));
  batch.fields["masked_lm_targets"] =
      batch.at("masked_lm_labels").reshape({-1}).index_select(0, batch.at("masked_lm_index"));
  CHECK(batch.at("masked_lm_index").size(0) == 9);
  CHECK(batch.at("masked_lm_index")[8].item<int64_t>() == 3 * 16 + 5);
  const hetseq::StepOutput out = task->valid_step(*model, batch);
  CHECK(out.sample_size == 4);
  CHECK(out.log.at("nsentences") == 4);
  CHECK(out.log.at("ntokens") == 9);

  auto& net = dynamic_cast<BertForPreTrainingImpl&>(*model);
  torch::NoGradGuard no_grad;
  const auto enc = net.bert->forward(batch.at("input_ids"), batch.at("segment_ids"), batch.at("input_mask"));
  auto p = net.named_parameters();
  double expected = 0, nll = 0;
  for (int64_t i = 0; i < 4; ++i) {
    const torch::Tensor labels = batch.at("masked_lm_labels")[i];
    const torch::Tensor where = labels.ne(-1).nonzero().squeeze(1);
    const torch::Tensor h = enc.sequence[i].index_select(0, where);
    torch::Tensor t = torch::matmul(h, p["cls.predictions.transform.dense.weight"].t()) + p["cls.predictions.transform.dense.bias"];
    t = torch::layer_norm(torch::gelu(t), {128}, p["cls.predictions.transform.LayerNorm.weight"],
                          p["cls.predictions.transform.LayerNorm.bias"], 1e-12);
    const torch::Tensor logits = torch::matmul(t, p["bert.embeddings.word_embeddings.weight"].t()) + p["cls.predictions.bias"];
    const torch::Tensor ce = torch::nn::functional::cross_entropy(
        logits, labels.index_select(0, where), torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    nll += ce.sum().item<double>();
    const torch::Tensor nsp_logits =
        torch::matmul(enc.pooled[i], p["cls.seq_relationship.weight"].t()) + p["cls.seq_relationship.bias"];
    const double nsp = -torch::log_softmax(nsp_logits, 0)[batch.at("next_sentence_labels")[i].item<int64_t>()].item<double>();
    expected += ce.mean().item<double>() + nsp;
  }
  CHECK(out.loss.item<double>() == Approx(expected).epsilon(1e-5));
  // Only counts known from the batch are on the host; the rest is read once per update
  // (Note [Statistics on the device]).
  CHECK(out.log.size() == 2);  // nsentences, ntokens
  for (const char* name : {"loss", "mlm_loss_sum", "nsp_loss_sum", "nll_loss", "mlm_correct", "nsp_correct"}) {
    INFO(name);
    CHECK(out.log_tensors.count(name) == 1);
  }
  const hetseq::LogSums log = hetseq::host_log(out);
  CHECK(log.at("loss") == Approx(expected).epsilon(1e-5));
  CHECK(log.at("nll_loss") == Approx(nll).epsilon(1e-5));
  const auto metrics = task->derived_metrics(log);
  CHECK(metrics.at("mlm_loss") + metrics.at("nsp_loss") == Approx(expected / 4 / std::log(2.0)).epsilon(1e-6));
  CHECK(metrics.at("mlm_accuracy") == Approx(100.0 * log.at("mlm_correct") / 9));
  CHECK(metrics.at("nsp_accuracy") == Approx(100.0 * log.at("nsp_correct") / 4));
}

TEST_CASE("bert: under bf16 and fp16 autocast the losses stay float32 and near the fp32 ones", "[bert][task][precision]") {
  TinyData data;
  auto task = make_task({"--data", data.dir.path(), "--config_file", kTaskTinyConfig});
  torch::manual_seed(4);
  auto model = task->build_model();
  model->eval();  // no dropout: the three passes see the same network
  const hetseq::Batch batch = task->load_dataset("train")->collate(iota(24));
  const hetseq::StepOutput fp32 = task->valid_step(*model, batch);
  for (const hetseq::Precision precision : {hetseq::Precision::kBFloat16, hetseq::Precision::kFloat16}) {
    INFO(hetseq::to_string(precision));
    const hetseq::AutocastGuard autocast(torch::kCPU, precision);
    const hetseq::StepOutput low = task->valid_step(*model, batch);
    CHECK(low.loss.scalar_type() == torch::kFloat32);
    CHECK(low.sample_size == fp32.sample_size);
    // bfloat16 keeps 8 bits of mantissa, float16 11; summed over many tokens the errors mostly cancel
    // (seen: 2e-5 relative for bf16, 1e-6 for fp16).
    const hetseq::LogSums a = hetseq::host_log(low), b = hetseq::host_log(fp32);
    CHECK(a.at("loss") == Approx(b.at("loss")).epsilon(1e-3));
    CHECK(a.at("nll_loss") == Approx(b.at("nll_loss")).epsilon(1e-3));
  }
}

TEST_CASE("bert: weights in Hugging Face's layout load by name and wrong shapes name the tensor", "[bert][task][hf]") {
  TempDir dir;
  BertConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 24;
  c.max_position_embeddings = 10;
  torch::manual_seed(3);
  hetseq::bert::BertForPreTraining source(c);
  // An encoder-only checkpoint (Hugging Face's BertModel: no `bert.` prefix, no heads), LayerNorm as gamma/beta in
  // layer 0 as in checkpoints converted from TensorFlow, and a buffer to skip.
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& p : source->named_parameters()) {
    std::string name = p.key();
    if (name.rfind("bert.", 0) != 0) continue;
    name = name.substr(5);
    if (name == "encoder.layer.0.output.LayerNorm.weight") name = "encoder.layer.0.output.LayerNorm.gamma";
    if (name == "encoder.layer.0.output.LayerNorm.bias") name = "encoder.layer.0.output.LayerNorm.beta";
    tensors[name] = p.value().detach().clone();
  }
  tensors["embeddings.position_ids"] = torch::arange(10).to(torch::kFloat32);
  tensors["classifier.weight"] = torch::zeros({3, 16});
  hetseq::test::write_safetensors(dir / "model.safetensors", tensors);

  torch::manual_seed(4);
  hetseq::bert::BertForPreTraining target(c);
  const auto report = hetseq::bert::load_hf_weights(*target, hetseq::bert::find_weights_file(dir.path()));
  CHECK(report.file == dir / "model.safetensors");
  CHECK(report.unexpected == std::vector<std::string>{"classifier.weight"});
  for (const auto& name : report.missing) CHECK(name.rfind("cls.", 0) == 0);
  CHECK(report.missing.size() == 7);
  auto src = source->named_parameters();
  for (const auto& p : target->named_parameters()) {
    if (p.key().rfind("bert.", 0) != 0) continue;
    INFO(p.key());
    CHECK(torch::equal(p.value(), src[p.key()]));
  }
  SECTION("into a bare BertModel, from a pretraining checkpoint") {
    std::map<std::string, torch::Tensor> full;
    for (const auto& p : source->named_parameters()) full[p.key()] = p.value().detach().clone();
    hetseq::test::write_safetensors(dir / "full.safetensors", full);
    hetseq::bert::BertModel bare(c);
    const auto r = hetseq::bert::load_hf_weights(*bare, dir / "full.safetensors");
    CHECK(r.missing.empty());
    CHECK(r.unexpected.size() == 7);  // the heads
    CHECK(torch::equal(bare->named_parameters()["pooler.dense.weight"], src["bert.pooler.dense.weight"]));
  }
  SECTION("a shape mismatch names the file and the tensor") {
    tensors["encoder.layer.1.intermediate.dense.weight"] = torch::zeros({30, 16});
    hetseq::test::write_safetensors(dir / "bad.safetensors", tensors);
    CHECK_THROWS_WITH(hetseq::bert::load_hf_weights(*target, dir / "bad.safetensors"),
                      Catch::Contains("bad.safetensors") && Catch::Contains("encoder.layer.1.intermediate.dense.weight") &&
                          Catch::Contains("[30, 16]"));
  }
  SECTION("a file that is no BERT checkpoint") {
    hetseq::test::write_safetensors(dir / "other.safetensors", {{"conv.weight", torch::zeros({2, 2})}});
    CHECK_THROWS_WITH(hetseq::bert::load_hf_weights(*target, dir / "other.safetensors"),
                      Catch::Contains("other.safetensors") && Catch::Contains("none of its 1 tensors"));
    std::ofstream(dir / "junk.safetensors") << "junk";
    CHECK_THROWS_WITH(hetseq::bert::load_hf_weights(*target, dir / "junk.safetensors"),
                      Catch::Contains("junk.safetensors") && Catch::Contains("not a valid safetensors file"));
  }
}

// Note [Static BERT batches]: masked positions padded to a fixed count with ignored targets give the loss, the
// statistics and the gradients of the unpadded batch. The loss is equal (the pads add exact zeros, in order);
// the logged sums within 1e-6 (a sum over more, zero, terms may group its additions otherwise); the gradients
// within 1e-6 of the largest, since the products over the masked rows (the decoder's weight gradient) may sum
// in another order over more rows.
TEST_CASE("BERT batches padded to one shape train as the unpadded ones", "[bert][task]") {
  TinyData data;
  auto options = [&](bool static_shapes) {
    hetseq::bert::BertTaskOptions o;
    o.data = data.dir.path();
    o.config_file = kTaskTinyConfig;
    o.config = hetseq::bert::read_bert_config(kTaskTinyConfig);
    o.max_pred_length = 4;
    o.static_shapes = static_shapes;
    return o;
  };
  hetseq::bert::BertTask plain(options(false)), padded(options(true));
  torch::manual_seed(4);
  auto model = plain.build_model();
  model->eval();  // no dropout: both passes see the same numbers
  const auto plain_data = plain.load_dataset("train");
  const auto padded_data = padded.load_dataset("train");
  const std::vector<int64_t> rows{0, 3, 7, 11, 19};
  const hetseq::Batch a = plain_data->collate(rows);
  const hetseq::Batch b = padded_data->collate(rows);
  // Two masked tokens a row (make_shard), padded to 5 rows x 4 slots; input_mask kept.
  CHECK(a.at("masked_lm_index").size(0) == 10);
  CHECK(b.at("masked_lm_index").size(0) == 20);
  CHECK(b.at("masked_lm_targets").slice(0, 10).eq(-1).all().item<bool>());
  CHECK(b.at("masked_lm_targets").ne(-1).sum().item<int64_t>() == 10);  // the real ones
  CHECK(b.fields.count("input_mask") == 1);
  // Another batch of 5 rows has the same shapes.
  const hetseq::Batch c = padded_data->collate({1, 2, 4, 5, 6});
  for (const auto& [name, tensor] : b.fields) {
    INFO(name);
    CHECK(c.at(name).sizes() == tensor.sizes());
  }

  auto run = [&](hetseq::bert::BertTask& task, const hetseq::Batch& batch) {
    model->zero_grad();
    hetseq::StepOutput out = task.compute_loss(*model, batch);
    out.loss.backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return std::make_pair(out, grads);
  };
  const auto [plain_out, plain_grads] = run(plain, a);
  const auto [padded_out, padded_grads] = run(padded, b);
  CHECK(padded_out.loss.item<double>() == plain_out.loss.item<double>());
  const hetseq::LogSums plain_log = hetseq::host_log(plain_out), padded_log = hetseq::host_log(padded_out);
  for (const auto& [name, value] : plain_log) {
    INFO(name);
    // ntokens (on the device when padded) and the correct counts exactly; the token sum over more (zero) terms
    // may round in another order.
    CHECK(padded_log.at(name) == Approx(value).epsilon(1e-6));
  }
  double worst = 0;
  for (size_t i = 0; i < plain_grads.size(); ++i) {
    worst = std::max(worst, ((padded_grads[i] - plain_grads[i]).abs().max() /
                             plain_grads[i].abs().max().clamp_min(1e-12)).item<double>());
  }
  CHECK(worst < 1e-6);
}
