// The reference check: hetseq's BertModel with the weights of a real pretrained BERT (all-MiniLM-L6-v2, in
// Hugging Face's layout) against the outputs of Hugging Face transformers on the same input, within 1e-4 (fp32).
// Hidden from a plain test run: scripts/bert_reference_check.sh writes the reference with transformers
// (scripts/bert_reference.py) and runs this test with HETSEQ_BERT_MODEL and HETSEQ_BERT_REFERENCE set; ctest runs
// that script as the test `bert_reference_vs_transformers`.

#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "tasks/bert/bert_config.h"
#include "tasks/bert/bert_model.h"
#include "tasks/bert/hf_weights.h"

TEST_CASE("our BERT encoder matches transformers on a pretrained model", "[.][bert_reference]") {
  const char* model_dir = std::getenv("HETSEQ_BERT_MODEL");
  const char* reference_file = std::getenv("HETSEQ_BERT_REFERENCE");
  REQUIRE(model_dir != nullptr);  // set by scripts/bert_reference_check.sh
  REQUIRE(reference_file != nullptr);
  const hetseq::bert::BertConfig config = hetseq::bert::read_bert_config(std::string(model_dir) + "/bert_config.json");
  hetseq::bert::BertModel model(config);
  const auto report = hetseq::bert::load_hf_weights(*model, hetseq::bert::find_weights_file(model_dir));
  CHECK(report.missing.empty());
  CHECK(report.loaded.size() == model->parameters().size());
  model->eval();

  auto reference = hetseq::bert::read_safetensors(reference_file);
  torch::NoGradGuard no_grad;
  const auto out = model->forward(reference.at("input_ids"), reference.at("token_type_ids"),
                                  reference.at("attention_mask"));
  const torch::Tensor mask = reference.at("attention_mask").unsqueeze(-1).to(torch::kFloat32);  // [B, S, 1]
  // Every position, padding included (transformers computes padded positions too, with the same mask).
  const double hidden_error = (out.sequence - reference.at("last_hidden_state")).abs().max().item<double>();
  const double token_error = ((out.sequence - reference.at("last_hidden_state")).abs() * mask).max().item<double>();
  const double pooled_error = (out.pooled - reference.at("pooler_output")).abs().max().item<double>();
  INFO("max |ours - transformers|: hidden states " << hidden_error << " (tokens " << token_error << "), pooled "
                                                    << pooled_error);
  CHECK(token_error < 1e-4);
  CHECK(hidden_error < 1e-4);
  CHECK(pooled_error < 1e-4);
  std::printf("[bert_reference] %s: max abs difference to transformers: hidden states %.3g, pooled output %.3g\n",
              model_dir, hidden_error, pooled_error);
}
