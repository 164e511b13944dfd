#include "tasks/bert/bert_model.h"

#include <cmath>
#include <memory>

#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq::bert {

namespace F = torch::nn::functional;

// Note [Fused attention]
// ~~~~~~~~~~~~~~~~~~~~~~
// BERT's attention is softmax(Q K^T / sqrt(d) + mask) V per head, with dropout on the probabilities, where the
// mask adds a large negative number at padded keys. scaled_dot_product_attention computes the same with a boolean
// mask (true = may attend), the same 1/sqrt(d) scale and the same dropout on the probabilities, in one fused
// kernel (flash or memory-efficient attention on CUDA, a fused CPU kernel otherwise) without materialising the
// [B, heads, S, S] scores for the backward pass. Every query row attends to at least the [CLS] token, so no row is
// fully masked (where the additive and the boolean forms would differ). tests/bert/test_bert_model.cpp checks it
// against the explicit formula.

// Note [One QKV product]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Attention's query, key and value are three projections of the same hidden states. As three Linear layers
// they cost three matrix products, and under autocast three casts of the same input; as one [3H, H] matrix
// (`attention.self.qkv`) they are one product whose output is split into views. Each output element is the
// same dot product as before, so the result equals the three products up to the GEMM's blocking of the
// output columns (tests/bert/test_bert_model.cpp states the tolerance). Checkpoints in Google's and Hugging
// Face's layout keep three tensors, `attention.self.{query,key,value}.{weight,bias}`: fused_slice says which
// rows of the fused parameter each one is, and --init-from loads them there (Note [Hugging Face names]).

torch::Tensor activate(const torch::Tensor& x, Activation act) {
  switch (act) {
    case Activation::kGelu: return F::gelu(x);
    case Activation::kGeluTanh: return F::gelu(x, F::GELUFuncOptions().approximate("tanh"));
    case Activation::kRelu: return torch::relu(x);
    case Activation::kSilu: return F::silu(x);
  }
  return F::gelu(x);
}

namespace {

/// A parameterless module that only groups children, so that parameter names follow Google's layout
/// (e.g. `attention.self.query`).
std::shared_ptr<torch::nn::Module> group(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>(name));
}

torch::nn::LayerNorm make_layer_norm(const BertConfig& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps));
}

}  // namespace

BertEmbeddingsImpl::BertEmbeddingsImpl(const BertConfig& c) {
  word_embeddings = register_module("word_embeddings", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  position_embeddings =
      register_module("position_embeddings", torch::nn::Embedding(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings = register_module("token_type_embeddings", torch::nn::Embedding(c.type_vocab_size, c.hidden_size));
  layer_norm = register_module("LayerNorm", make_layer_norm(c));
  dropout = register_module("dropout", torch::nn::Dropout(c.hidden_dropout_prob));
}

torch::Tensor BertEmbeddingsImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids) {
  const int64_t seq_len = input_ids.size(1);
  HETSEQ_ASSERT(seq_len <= position_embeddings->weight.size(0),
                "sequence length {} exceeds max_position_embeddings {}", seq_len, position_embeddings->weight.size(0));
  const torch::Tensor positions = torch::arange(seq_len, input_ids.options().dtype(torch::kInt64));  // [S]
  torch::Tensor x = word_embeddings->forward(input_ids) + position_embeddings->forward(positions).unsqueeze(0) +
                    token_type_embeddings->forward(token_type_ids);
  return dropout->forward(layer_norm->forward(x));
}

BertLayerImpl::BertLayerImpl(const BertConfig& c) : config_(c) {
  const int64_t h = c.hidden_size;
  auto attention = group(*this, "attention");
  auto self = group(*attention, "self");
  qkv_ = self->register_module("qkv", torch::nn::Linear(h, 3 * h));  // Note [One QKV product]
  auto attention_output = group(*attention, "output");
  attention_dense_ = attention_output->register_module("dense", torch::nn::Linear(h, h));
  attention_norm_ = attention_output->register_module("LayerNorm", make_layer_norm(c));
  auto intermediate = group(*this, "intermediate");
  intermediate_ = intermediate->register_module("dense", torch::nn::Linear(h, c.intermediate_size));
  auto output = group(*this, "output");
  output_dense_ = output->register_module("dense", torch::nn::Linear(c.intermediate_size, h));
  output_norm_ = output->register_module("LayerNorm", make_layer_norm(c));
  dropout_ = register_module("dropout", torch::nn::Dropout(c.hidden_dropout_prob));
}

torch::Tensor BertLayerImpl::forward(const torch::Tensor& hidden, const torch::Tensor& attend) {
  const int64_t b = hidden.size(0), s = hidden.size(1);
  const int64_t heads = config_.num_attention_heads, d = config_.head_size();
  // [B, S, 3H] -> three [B, heads, S, d] views (Note [One QKV product])
  const std::vector<torch::Tensor> qkv = qkv_->forward(hidden).view({b, s, 3, heads, d}).permute({2, 0, 3, 1, 4}).unbind(0);
  const torch::Tensor& q = qkv[0];
  const torch::Tensor& k = qkv[1];
  const torch::Tensor& v = qkv[2];
  const double p = is_training() ? config_.attention_probs_dropout_prob : 0.0;
  std::optional<torch::Tensor> mask;
  if (attend.defined()) mask = attend;
  // See Note [Fused attention].
  const torch::Tensor context = at::scaled_dot_product_attention(q, k, v, mask, p, /*is_causal=*/false)
                                    .transpose(1, 2)
                                    .reshape({b, s, heads * d});  // [B, S, H]
  const torch::Tensor attended =
      attention_norm_->forward(dropout_->forward(attention_dense_->forward(context)) + hidden);
  const torch::Tensor inner = activate(intermediate_->forward(attended), config_.hidden_act);  // [B, S, I]
  return output_norm_->forward(dropout_->forward(output_dense_->forward(inner)) + attended);
}

BertModelImpl::BertModelImpl(const BertConfig& c) : config_(c) {
  embeddings = register_module("embeddings", BertEmbeddings(c));
  auto encoder = group(*this, "encoder");
  layers_ = encoder->register_module("layer", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers_->push_back(BertLayer(c));
  auto pooler = group(*this, "pooler");
  pooler_ = pooler->register_module("dense", torch::nn::Linear(c.hidden_size, c.hidden_size));
}

BertEncoderOutput BertModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids,
                                         const torch::Tensor& attention_mask) {
  torch::Tensor attend;  // bool [B, 1, 1, S]
  if (attention_mask.defined()) attend = attention_mask.ne(0).unsqueeze(1).unsqueeze(2);
  torch::Tensor x = embeddings->forward(input_ids, token_type_ids);
  for (size_t i = 0; i < layers_->size(); ++i) {
    auto* layer = (*layers_)[i]->as<BertLayerImpl>();
    x = run_unit(runner_, i, [&] { return layer->forward(x, attend); });
  }
  const torch::Tensor first = x.select(1, 0);  // [B, H]: the [CLS] token
  return BertEncoderOutput{x, torch::tanh(pooler_->forward(first))};
}

std::vector<std::shared_ptr<torch::nn::Module>> BertModelImpl::layers() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& layer : *layers_) out.push_back(layer);
  return out;
}

BertForPreTrainingImpl::BertForPreTrainingImpl(const BertConfig& c) : config_(c) {
  bert = register_module("bert", BertModel(c));
  auto cls = group(*this, "cls");
  auto predictions = group(*cls, "predictions");
  auto transform = group(*predictions, "transform");
  transform_ = transform->register_module("dense", torch::nn::Linear(c.hidden_size, c.hidden_size));
  transform_norm_ = transform->register_module("LayerNorm", make_layer_norm(c));
  decoder_bias_ = predictions->register_parameter("bias", torch::zeros({c.vocab_size}));
  seq_relationship_ = cls->register_module("seq_relationship", torch::nn::Linear(c.hidden_size, 2));
  init_bert_weights(*this, c.initializer_range);
}

BertPreTrainingOutput BertForPreTrainingImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids,
                                                      const torch::Tensor& attention_mask,
                                                      const torch::Tensor& masked_index) {
  const BertEncoderOutput encoded = bert->forward(input_ids, token_type_ids, attention_mask);
  const torch::Tensor flat = encoded.sequence.reshape({-1, config_.hidden_size});  // [B * S, H]
  const torch::Tensor selected = flat.index_select(0, masked_index);               // [M, H]
  const torch::Tensor transformed =
      transform_norm_->forward(activate(transform_->forward(selected), config_.hidden_act));
  // The decoder is tied to the word embeddings (one matrix, two uses), with a bias of its own.
  const torch::Tensor logits = F::linear(transformed, bert->embeddings->word_embeddings->weight, decoder_bias_);
  return BertPreTrainingOutput{logits, seq_relationship_->forward(encoded.pooled)};
}

std::optional<FusedSlice> fused_slice(const std::string& name) {
  static const std::string self = "attention.self.";
  const size_t at = name.find(self);
  if (at == std::string::npos) return std::nullopt;
  const std::string rest = name.substr(at + self.size());  // "query.weight", ...
  const char* parts[] = {"query.", "key.", "value."};
  for (int64_t part = 0; part < 3; ++part) {
    const std::string prefix = parts[part];
    if (rest.rfind(prefix, 0) != 0) continue;
    const std::string leaf = rest.substr(prefix.size());
    if (leaf != "weight" && leaf != "bias") return std::nullopt;
    return FusedSlice{name.substr(0, at + self.size()) + "qkv." + leaf, part};
  }
  return std::nullopt;
}

void init_bert_weights(torch::nn::Module& module, double initializer_range) {
  torch::NoGradGuard no_grad;
  // Not the module itself: init_bert_weights runs in constructors, before a shared_ptr owns the module.
  for (const auto& m : module.modules(/*include_self=*/false)) {
    if (auto* linear = m->as<torch::nn::LinearImpl>()) {
      linear->weight.normal_(0.0, initializer_range);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = m->as<torch::nn::EmbeddingImpl>()) {
      embedding->weight.normal_(0.0, initializer_range);
    } else if (auto* norm = m->as<torch::nn::LayerNormImpl>()) {
      norm->weight.fill_(1.0);
      norm->bias.zero_();
    }
  }
  for (auto& p : module.named_parameters(/*recurse=*/true)) {
    if (p.key() == "cls.predictions.bias") p.value().zero_();
  }
}

}  // namespace hetseq::bert
