// BertModel and BertForPreTraining: parameter names and counts, initialisation, the tied decoder, and the fused
// attention against BERT's formula written out here from the named parameters.

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "support/test_paths.h"
#include "tasks/bert/bert_config.h"
#include "tasks/bert/bert_model.h"

using hetseq::bert::BertConfig;
using hetseq::bert::BertForPreTraining;
using hetseq::bert::BertModel;

namespace {

const std::string kConfigs = hetseq::test::source_dir() + "/configs/";

BertConfig small_config() {
  BertConfig c;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 32;
  c.max_position_embeddings = 12;
  return c;
}

/// BERT's encoder written out with an explicit softmax and an additive mask, from parameters named as Google's.
torch::Tensor reference_encoder(torch::OrderedDict<std::string, torch::Tensor>& p, const BertConfig& c,
                                const torch::Tensor& ids, const torch::Tensor& types, const torch::Tensor& mask,
                                const std::string& prefix) {
  auto w = [&](const std::string& name) { return p[prefix + name]; };
  auto ln = [&](const torch::Tensor& x, const std::string& name) {
    return torch::layer_norm(x, {c.hidden_size}, w(name + ".weight"), w(name + ".bias"), 1e-12);
  };
  auto linear = [&](const torch::Tensor& x, const std::string& name) {
    return torch::matmul(x, w(name + ".weight").t()) + w(name + ".bias");
  };
  const int64_t b = ids.size(0), s = ids.size(1), h = c.num_attention_heads, d = c.head_size();
  torch::Tensor x = w("embeddings.word_embeddings.weight").index_select(0, ids.reshape(-1)).view({b, s, -1}) +
                    w("embeddings.position_embeddings.weight").slice(0, 0, s).unsqueeze(0) +
                    w("embeddings.token_type_embeddings.weight").index_select(0, types.reshape(-1)).view({b, s, -1});
  x = ln(x, "embeddings.LayerNorm");
  const torch::Tensor additive = (1.0 - mask.to(torch::kFloat32)).view({b, 1, 1, s}) * -10000.0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string L = "encoder.layer." + std::to_string(l) + ".";
    auto heads = [&](const torch::Tensor& t) { return t.view({b, s, h, d}).permute({0, 2, 1, 3}); };
    // The three projections from their rows of the fused parameter (Note [One QKV product]), one product each.
    auto projection = [&](int64_t part) {
      const std::string fused = L + "attention.self.qkv";
      const int64_t H = c.hidden_size;
      return torch::matmul(x, w(fused + ".weight").narrow(0, part * H, H).t()) + w(fused + ".bias").narrow(0, part * H, H);
    };
    const torch::Tensor q = heads(projection(0));
    const torch::Tensor k = heads(projection(1));
    const torch::Tensor v = heads(projection(2));
    const torch::Tensor scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d)) + additive;
    const torch::Tensor context = torch::matmul(torch::softmax(scores, -1), v).permute({0, 2, 1, 3}).reshape({b, s, -1});
    const torch::Tensor a = ln(linear(context, L + "attention.output.dense") + x, L + "attention.output.LayerNorm");
    const torch::Tensor inner = torch::gelu(linear(a, L + "intermediate.dense"));
    x = ln(linear(inner, L + "output.dense") + a, L + "output.LayerNorm");
  }
  return x;
}

}  // namespace

TEST_CASE("BertForPreTraining has Google's parameter names and bert-base's parameter count", "[bert][model]") {
  const BertConfig base = hetseq::bert::read_bert_config(kConfigs + "bert-base-uncased.json");
  BertForPreTraining model(base);
  const auto params = model->named_parameters();
  for (const char* name : {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
                           "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.weight",
                           "bert.encoder.layer.0.attention.self.qkv.weight",
                           "bert.encoder.layer.11.attention.output.LayerNorm.bias",
                           "bert.encoder.layer.5.intermediate.dense.weight", "bert.encoder.layer.5.output.dense.bias",
                           "bert.pooler.dense.weight", "cls.predictions.transform.dense.weight",
                           "cls.predictions.transform.LayerNorm.weight", "cls.predictions.bias",
                           "cls.seq_relationship.weight"}) {
    INFO(name);
    CHECK(params.contains(name));
  }
  int64_t count = 0;
  for (const auto& p : params) count += p.value().numel();
  CHECK(count == 110106428);  // Hugging Face's BertForPreTraining(bert-base-uncased): the decoder is tied
}

TEST_CASE("BERT's initialisation: normal weights with initializer_range as std and zero biases and unit LayerNorm", "[bert][model]") {
  torch::manual_seed(3);
  BertConfig c = small_config();
  c.vocab_size = 2000;
  c.hidden_size = 64;
  c.initializer_range = 0.05;
  BertForPreTraining model(c);
  auto p = model->named_parameters();
  const torch::Tensor words = p["bert.embeddings.word_embeddings.weight"];
  CHECK(words.std().item<double>() == Approx(0.05).epsilon(0.02));
  CHECK(std::abs(words.mean().item<double>()) < 0.002);
  CHECK(p["bert.encoder.layer.0.attention.self.qkv.weight"].std().item<double>() == Approx(0.05).epsilon(0.1));
  CHECK(p["bert.encoder.layer.1.output.dense.bias"].abs().max().item<double>() == 0.0);
  CHECK(p["cls.predictions.bias"].abs().max().item<double>() == 0.0);
  CHECK((p["bert.encoder.layer.1.output.LayerNorm.weight"] == 1).all().item<bool>());
  CHECK(p["cls.predictions.transform.LayerNorm.bias"].abs().max().item<double>() == 0.0);
}

TEST_CASE("the fused attention gives BERT's encoder output with padding", "[bert][model]") {
  torch::manual_seed(5);
  const BertConfig c = small_config();
  BertForPreTraining model(c);
  model->eval();
  const torch::Tensor ids = torch::randint(0, c.vocab_size, {3, 10}, torch::kInt64);
  const torch::Tensor types = torch::randint(0, 2, {3, 10}, torch::kInt64);
  torch::Tensor mask = torch::ones({3, 10}, torch::kInt64);
  mask.index_put_({1, torch::indexing::Slice(6)}, 0);
  mask.index_put_({2, torch::indexing::Slice(2)}, 0);
  torch::NoGradGuard no_grad;
  const auto ours = model->bert->forward(ids, types, mask);
  auto params = model->named_parameters();
  const torch::Tensor expected = reference_encoder(params, c, ids, types, mask, "bert.");
  CHECK((ours.sequence - expected).abs().max().item<double>() < 1e-5);
  const torch::Tensor pooled = torch::tanh(torch::matmul(expected.select(1, 0), params["bert.pooler.dense.weight"].t()) +
                                           params["bert.pooler.dense.bias"]);
  CHECK((ours.pooled - pooled).abs().max().item<double>() < 1e-5);
  // Without a mask the same as an all-ones mask.
  const auto unmasked = model->bert->forward(ids, types);
  const auto ones = model->bert->forward(ids, types, torch::ones({3, 10}, torch::kInt64));
  CHECK((unmasked.sequence - ones.sequence).abs().max().item<double>() < 1e-6);
}

TEST_CASE("the MLM decoder is tied to the word embeddings and evaluated only at the given positions", "[bert][model]") {
  torch::manual_seed(7);
  const BertConfig c = small_config();
  BertForPreTraining model(c);
  model->eval();
  const torch::Tensor ids = torch::randint(0, c.vocab_size, {2, 8}, torch::kInt64);
  const torch::Tensor types = torch::zeros({2, 8}, torch::kInt64);
  const torch::Tensor mask = torch::ones({2, 8}, torch::kInt64);
  const torch::Tensor positions = torch::tensor({1, 3, 12}, torch::kInt64);  // (0, 1), (0, 3), (1, 4)
  const auto out = model->forward(ids, types, mask, positions);
  REQUIRE(out.mlm_logits.sizes() == torch::IntArrayRef({3, c.vocab_size}));
  REQUIRE(out.nsp_logits.sizes() == torch::IntArrayRef({2, 2}));
  out.mlm_logits.sum().backward();
  auto p = model->named_parameters();
  CHECK_FALSE(p.contains("cls.predictions.decoder.weight"));
  // The decoder's gradient reaches the word embedding rows of every vocabulary entry, not only the input ids.
  const torch::Tensor grad = p["bert.embeddings.word_embeddings.weight"].grad();
  REQUIRE(grad.defined());
  CHECK((grad.abs().sum(1) > 0).all().item<bool>());
}

TEST_CASE("dropout is active in training mode only", "[bert][model]") {
  torch::manual_seed(11);
  BertConfig c = small_config();
  c.hidden_dropout_prob = 0.5;
  c.attention_probs_dropout_prob = 0.5;
  BertModel model(c);
  hetseq::bert::init_bert_weights(*model, c.initializer_range);
  const torch::Tensor ids = torch::randint(0, c.vocab_size, {2, 8}, torch::kInt64);
  const torch::Tensor types = torch::zeros({2, 8}, torch::kInt64);
  torch::NoGradGuard no_grad;
  model->eval();
  const auto a = model->forward(ids, types).sequence;
  const auto b = model->forward(ids, types).sequence;
  CHECK(torch::equal(a, b));
  model->train();
  const auto d = model->forward(ids, types).sequence;
  const auto e = model->forward(ids, types).sequence;
  CHECK_FALSE(torch::equal(d, e));
}

TEST_CASE("Google's query, key and value names are rows of the fused QKV parameter", "[bert][model]") {
  using hetseq::bert::fused_slice;
  const auto q = fused_slice("bert.encoder.layer.3.attention.self.query.weight");
  REQUIRE(q);
  CHECK(q->parameter == "bert.encoder.layer.3.attention.self.qkv.weight");
  CHECK(q->part == 0);
  const auto v = fused_slice("encoder.layer.0.attention.self.value.bias");
  REQUIRE(v);
  CHECK(v->parameter == "encoder.layer.0.attention.self.qkv.bias");
  CHECK(v->part == 2);
  CHECK(fused_slice("bert.encoder.layer.0.attention.self.key.weight")->part == 1);
  CHECK(!fused_slice("bert.encoder.layer.0.attention.output.dense.weight"));
  CHECK(!fused_slice("bert.encoder.layer.0.attention.self.query.gamma"));
}

// Note [One QKV product]: the fused product against three products with the same rows, forward and backward
// (to the input and to each part of the weight). The tolerance: each output element is the same dot product,
// summed in an order that the GEMM's blocking may change, so a few float32 ulps of the values' size.
TEST_CASE("one QKV product equals the three products of its parts, forward and backward", "[bert][model]") {
  torch::manual_seed(8);
  const int64_t H = 64;
  const torch::Tensor x = torch::randn({4, 24, H}, torch::requires_grad());
  const torch::Tensor weight = (torch::randn({3 * H, H}) * 0.05).requires_grad_();
  const torch::Tensor bias = (torch::randn({3 * H}) * 0.05).requires_grad_();
  const torch::Tensor upstream = torch::randn({4, 24, 3 * H});

  const torch::Tensor fused = torch::nn::functional::linear(x, weight, bias);
  const auto fused_grads = torch::autograd::grad({fused}, {x, weight, bias}, {upstream});

  std::vector<torch::Tensor> parts;
  for (int64_t part = 0; part < 3; ++part) {
    parts.push_back(torch::nn::functional::linear(x, weight.narrow(0, part * H, H), bias.narrow(0, part * H, H)));
  }
  const torch::Tensor separate = torch::cat(parts, -1);
  const auto separate_grads = torch::autograd::grad({separate}, {x, weight, bias}, {upstream});

  auto relative = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max()).item<double>();
  };
  CHECK(relative(fused, separate) < 1e-6);
  for (size_t i = 0; i < 3; ++i) {
    INFO("gradient " << i << " (input, weight, bias)");
    CHECK(relative(fused_grads[i], separate_grads[i]) < 1e-6);
  }
}

// Note [Fused attention]: a batch without padding passes no mask (so that a GPU may pick flash attention); the
// result must be that of an all-true mask, forward and backward, within float32 rounding of two kernels.
TEST_CASE("attention without a mask equals attention with an all-true mask", "[bert][model]") {
  torch::manual_seed(9);
  const BertConfig c = small_config();
  BertForPreTraining model(c);
  model->eval();  // no dropout: the two runs see the same numbers
  const torch::Tensor ids = torch::randint(0, c.vocab_size, {3, 10}, torch::kInt64);
  const torch::Tensor types = torch::randint(0, 2, {3, 10}, torch::kInt64);
  const torch::Tensor upstream = torch::randn({3, 10, c.hidden_size});
  auto run = [&](const torch::Tensor& mask) {
    model->zero_grad();
    const auto out = model->bert->forward(ids, types, mask);
    out.sequence.backward(upstream);
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return std::make_pair(out.sequence.detach(), grads);
  };
  const auto [masked, masked_grads] = run(torch::ones({3, 10}, torch::kInt64));
  const auto [open, open_grads] = run(torch::Tensor());
  CHECK((masked - open).abs().max().item<double>() < 1e-5);
  REQUIRE(masked_grads.size() == open_grads.size());
  double worst = 0;
  for (size_t i = 0; i < masked_grads.size(); ++i) {
    if (!masked_grads[i].defined()) continue;
    REQUIRE(open_grads[i].defined());
    worst = std::max(worst, ((masked_grads[i] - open_grads[i]).abs().max() /
                             masked_grads[i].abs().max().clamp_min(1e-12)).item<double>());
  }
  CHECK(worst < 1e-5);
}
