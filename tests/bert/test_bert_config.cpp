// BertConfig: Google's bert_config.json, the shipped configs, and clear errors for bad files.

#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "hetseq/core/error.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"
#include "tasks/bert/bert_config.h"

using hetseq::InputError;
using hetseq::bert::BertConfig;
using hetseq::bert::parse_bert_config;
using hetseq::bert::read_bert_config;

namespace {

const std::string kConfigs = hetseq::test::source_dir() + "/configs/";

std::string error_of(const std::string& json) {
  try {
    parse_bert_config(json, "test.json");
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("expected an InputError for " << json);
  return {};
}

/// bert-tiny's config text with `key`'s value replaced by `value` (or removed when `value` is empty).
std::string tiny_with(const std::string& key, const std::string& value) {
  std::string text = R"({"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 512, "max_position_embeddings": 512,
    "num_attention_heads": 2, "num_hidden_layers": 2, "type_vocab_size": 2, "vocab_size": 30522})";
  const size_t at = text.find("\"" + key + "\"");
  REQUIRE(at != std::string::npos);
  size_t end = text.find_first_of(",}", at);
  if (value.empty()) {
    if (text[end] == ',') return text.substr(0, at) + text.substr(end + 1);
    return text.substr(0, text.rfind(',', at)) + text.substr(end);  // the last key: drop the comma before it
  }
  return text.substr(0, at) + "\"" + key + "\": " + value + text.substr(end);
}

}  // namespace

TEST_CASE("the shipped BERT configs read as Google's BERT sizes", "[bert][config]") {
  const BertConfig base = read_bert_config(kConfigs + "bert-base-uncased.json");
  CHECK(base.vocab_size == 30522);
  CHECK(base.hidden_size == 768);
  CHECK(base.num_hidden_layers == 12);
  CHECK(base.num_attention_heads == 12);
  CHECK(base.intermediate_size == 3072);
  CHECK(base.hidden_act == hetseq::bert::Activation::kGelu);
  CHECK(base.max_position_embeddings == 512);
  CHECK(base.type_vocab_size == 2);
  CHECK(base.initializer_range == Approx(0.02));
  CHECK(base.head_size() == 64);

  const BertConfig large = read_bert_config(kConfigs + "bert-large-uncased.json");
  CHECK(large.hidden_size == 1024);
  CHECK(large.num_hidden_layers == 24);
  CHECK(large.num_attention_heads == 16);
  CHECK(large.intermediate_size == 4096);

  const BertConfig tiny = read_bert_config(kConfigs + "bert-tiny.json");
  CHECK(tiny.hidden_size == 128);
  CHECK(tiny.num_hidden_layers == 2);
  CHECK(tiny.num_attention_heads == 2);
}

TEST_CASE("a BERT config survives to_json and back", "[bert][config]") {
  BertConfig c = read_bert_config(kConfigs + "bert-tiny.json");
  c.hidden_act = hetseq::bert::Activation::kGeluTanh;
  c.hidden_dropout_prob = 0.25;
  const BertConfig back = parse_bert_config(hetseq::bert::to_json(c), "round trip");
  CHECK(back.hidden_act == c.hidden_act);
  CHECK(back.hidden_dropout_prob == c.hidden_dropout_prob);
  CHECK(back.vocab_size == c.vocab_size);
  CHECK(back.num_hidden_layers == c.num_hidden_layers);
}

TEST_CASE("bad BERT configs are clear errors naming the file and the key", "[bert][config]") {
  CHECK_THAT(error_of(tiny_with("vocab_size", "")), Catch::Contains("test.json") && Catch::Contains("missing key \"vocab_size\""));
  CHECK_THAT(error_of(tiny_with("hidden_size", "")), Catch::Contains("missing key \"hidden_size\""));
  CHECK_THAT(error_of(tiny_with("vocab_size", "30522, \"layer_norm_eps\": 1e-12")),
             Catch::Contains("unknown key \"layer_norm_eps\""));
  CHECK_THAT(error_of(tiny_with("hidden_size", "\"big\"")), Catch::Contains("\"hidden_size\" must be an integer"));
  CHECK_THAT(error_of(tiny_with("hidden_size", "127")), Catch::Contains("not a multiple of \"num_attention_heads\""));
  CHECK_THAT(error_of(tiny_with("hidden_act", "\"tanh\"")), Catch::Contains("\"hidden_act\"") && Catch::Contains("tanh"));
  CHECK_THAT(error_of(tiny_with("hidden_dropout_prob", "1.5")), Catch::Contains("\"hidden_dropout_prob\""));
  CHECK_THAT(error_of(tiny_with("num_hidden_layers", "0")), Catch::Contains("\"num_hidden_layers\" must be positive"));
  CHECK_THAT(error_of("[1, 2]"), Catch::Contains("JSON object"));
  CHECK_THAT(error_of("{\"vocab_size\": "), Catch::Contains("not valid JSON"));

  hetseq::test::TempDir dir;
  CHECK_THROWS_WITH(read_bert_config(dir / "nope.json"),
                    Catch::Contains("--config_file") && Catch::Contains("nope.json"));
  std::ofstream(dir / "bad.json") << tiny_with("type_vocab_size", "");
  CHECK_THROWS_WITH(read_bert_config(dir / "bad.json"), Catch::Contains("bad.json") && Catch::Contains("type_vocab_size"));
}
