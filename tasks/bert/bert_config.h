#pragma once
/// BERT's architecture as Google's `bert_config.json` describes it (`--config_file`).

#include <cstdint>
#include <string>

namespace hetseq::bert {

/// The activation of the feed-forward layers and of the MLM head's transform.
enum class Activation {
  kGelu,      // "gelu": the exact (erf) GELU of Google's BERT
  kGeluTanh,  // "gelu_new" or "gelu_pytorch_tanh": the tanh approximation
  kRelu,      // "relu"
  kSilu,      // "silu" or "swish"
};

/// Hyperparameters of a BERT model, with the keys and meaning of Google's `bert_config.json`. The defaults are
/// bert-base-uncased's.
struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  Activation hidden_act = Activation::kGelu;
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double initializer_range = 0.02;
  /// Not a key of Google's file: BERT's LayerNorm epsilon, fixed at 1e-12 as in Google's code.
  double layer_norm_eps = 1e-12;

  /// hidden_size / num_attention_heads.
  int64_t head_size() const { return hidden_size / num_attention_heads; }
  /// Checks the values (positive sizes, hidden_size divisible by the heads, probabilities in [0, 1)); throws
  /// hetseq::InputError naming `source` (the file) and the key otherwise.
  void validate(const std::string& source) const;
};

/// The name of `act` as written in bert_config.json ("gelu", "gelu_new", "relu", "silu").
std::string activation_name(Activation act);

/// Parses the `hidden_act` value; throws hetseq::InputError naming `source` and listing the known ones.
Activation parse_activation(const std::string& name, const std::string& source);

/// Parses a bert_config.json text. Every one of the eleven keys of Google's format must be present, and no other
/// key may be: an unknown or missing key, a value of the wrong type or an invalid value throws hetseq::InputError
/// naming `source` and the key.
BertConfig parse_bert_config(const std::string& json_text, const std::string& source);

/// Reads `path` (a bert_config.json); throws hetseq::InputError naming the file (and --config_file) when it cannot
/// be read or parsed.
BertConfig read_bert_config(const std::string& path);

/// The config as bert_config.json text (the eleven keys), which parse_bert_config reads back unchanged.
std::string to_json(const BertConfig& config);

}  // namespace hetseq::bert
