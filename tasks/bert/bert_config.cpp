#include "tasks/bert/bert_config.h"

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq::bert {
namespace {

using nlohmann::json;

const std::set<std::string>& known_keys() {
  static const std::set<std::string> keys{
      "vocab_size",          "hidden_size",         "num_hidden_layers",       "num_attention_heads",
      "intermediate_size",   "hidden_act",          "hidden_dropout_prob",     "attention_probs_dropout_prob",
      "max_position_embeddings", "type_vocab_size", "initializer_range"};
  return keys;
}

int64_t integer(const json& j, const std::string& key, const std::string& source) {
  const json& v = j.at(key);
  if (!v.is_number_integer()) {
    throw InputError(fmt::format("{}: \"{}\" must be an integer, got {}", source, key, v.dump()));
  }
  return v.get<int64_t>();
}

double number(const json& j, const std::string& key, const std::string& source) {
  const json& v = j.at(key);
  if (!v.is_number()) throw InputError(fmt::format("{}: \"{}\" must be a number, got {}", source, key, v.dump()));
  return v.get<double>();
}

}  // namespace

std::string activation_name(Activation act) {
  switch (act) {
    case Activation::kGelu: return "gelu";
    case Activation::kGeluTanh: return "gelu_new";
    case Activation::kRelu: return "relu";
    case Activation::kSilu: return "silu";
  }
  return "gelu";
}

Activation parse_activation(const std::string& name, const std::string& source) {
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  if (name == "relu") return Activation::kRelu;
  if (name == "silu" || name == "swish") return Activation::kSilu;
  throw InputError(fmt::format("{}: \"hidden_act\" is \"{}\"; known activations: gelu, gelu_new, gelu_pytorch_tanh, "
                               "relu, silu, swish",
                               source, name));
}

void BertConfig::validate(const std::string& source) const {
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) throw InputError(fmt::format("{}: \"{}\" must be positive, got {}", source, key, v));
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("intermediate_size", intermediate_size);
  positive("max_position_embeddings", max_position_embeddings);
  positive("type_vocab_size", type_vocab_size);
  if (hidden_size % num_attention_heads != 0) {
    throw InputError(fmt::format("{}: \"hidden_size\" {} is not a multiple of \"num_attention_heads\" {}", source,
                                 hidden_size, num_attention_heads));
  }
  auto probability = [&](const char* key, double p) {
    if (!(p >= 0.0 && p < 1.0)) {
      throw InputError(fmt::format("{}: \"{}\" must be a probability in [0, 1), got {}", source, key, p));
    }
  };
  probability("hidden_dropout_prob", hidden_dropout_prob);
  probability("attention_probs_dropout_prob", attention_probs_dropout_prob);
  if (!(initializer_range > 0)) {
    throw InputError(fmt::format("{}: \"initializer_range\" must be positive, got {}", source, initializer_range));
  }
}

BertConfig parse_bert_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw InputError(fmt::format("{}: not valid JSON ({}); give a BERT config such as configs/bert-base-uncased.json",
                                 source, e.what()));
  }
  if (!j.is_object()) throw InputError(fmt::format("{}: a BERT config must be a JSON object", source));
  for (const auto& item : j.items()) {
    if (known_keys().count(item.key()) == 0) {
      throw InputError(fmt::format("{}: unknown key \"{}\"; a bert_config.json has exactly the keys {}", source,
                                   item.key(), fmt::join(known_keys(), ", ")));
    }
  }
  for (const std::string& key : known_keys()) {
    if (!j.contains(key)) {
      throw InputError(fmt::format("{}: missing key \"{}\"; a bert_config.json has exactly the keys {}", source, key,
                                   fmt::join(known_keys(), ", ")));
    }
  }
  BertConfig c;
  c.vocab_size = integer(j, "vocab_size", source);
  c.hidden_size = integer(j, "hidden_size", source);
  c.num_hidden_layers = integer(j, "num_hidden_layers", source);
  c.num_attention_heads = integer(j, "num_attention_heads", source);
  c.intermediate_size = integer(j, "intermediate_size", source);
  if (!j.at("hidden_act").is_string()) {
    throw InputError(fmt::format("{}: \"hidden_act\" must be a string, got {}", source, j.at("hidden_act").dump()));
  }
  c.hidden_act = parse_activation(j.at("hidden_act").get<std::string>(), source);
  c.hidden_dropout_prob = number(j, "hidden_dropout_prob", source);
  c.attention_probs_dropout_prob = number(j, "attention_probs_dropout_prob", source);
  c.max_position_embeddings = integer(j, "max_position_embeddings", source);
  c.type_vocab_size = integer(j, "type_vocab_size", source);
  c.initializer_range = number(j, "initializer_range", source);
  c.validate(source);
  return c;
}

BertConfig read_bert_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw InputError(fmt::format("--config_file {}: cannot read the file; give a bert_config.json such as "
                                 "configs/bert-base-uncased.json",
                                 path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_bert_config(text.str(), "--config_file " + path);
}

std::string to_json(const BertConfig& c) {
  json j;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["intermediate_size"] = c.intermediate_size;
  j["hidden_act"] = activation_name(c.hidden_act);
  j["hidden_dropout_prob"] = c.hidden_dropout_prob;
  j["attention_probs_dropout_prob"] = c.attention_probs_dropout_prob;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["type_vocab_size"] = c.type_vocab_size;
  j["initializer_range"] = c.initializer_range;
  return j.dump(2);
}

}  // namespace hetseq::bert
