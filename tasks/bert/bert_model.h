#pragma once
/// BERT in LibTorch: the encoder (BertModel) and the pretraining model with its MLM and NSP heads
/// (BertForPreTraining). Submodules are named as in Google's BERT converted to PyTorch (Hugging Face and HetSeq
/// use the same names: `bert.embeddings.word_embeddings`, `bert.encoder.layer.3.attention.self.query`,
/// `cls.predictions.transform.LayerNorm`, ...), so that their weights load by name (tasks/bert/hf_weights.h).

#include <optional>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "hetseq/task/model_units.h"

#include "tasks/bert/bert_config.h"

namespace hetseq::bert {

/// Applies `act` element-wise.
torch::Tensor activate(const torch::Tensor& x, Activation act);

/// Word, position and token-type embeddings, summed, then LayerNorm and dropout.
class BertEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit BertEmbeddingsImpl(const BertConfig& config);
  /// input_ids, token_type_ids int64 [B, S] -> float [B, S, H]. S must not exceed max_position_embeddings.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids);

  torch::nn::Embedding word_embeddings{nullptr};
  torch::nn::Embedding position_embeddings{nullptr};
  torch::nn::Embedding token_type_embeddings{nullptr};
  torch::nn::LayerNorm layer_norm{nullptr};  // registered as "LayerNorm"
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertEmbeddings);

/// One transformer layer: self-attention (`attention.self.qkv`: the query, key and value projections as one
/// matrix, Note [One QKV product]; `attention.output.{dense,LayerNorm}`) and the feed-forward block
/// (`intermediate.dense`, `output.{dense,LayerNorm}`), post-LayerNorm as in BERT.
class BertLayerImpl : public torch::nn::Module {
 public:
  explicit BertLayerImpl(const BertConfig& config);
  /// hidden float [B, S, H]; `attend` bool [B, 1, 1, S] (true where a key may be attended to) or undefined for
  /// no padding. Uses LibTorch's fused scaled_dot_product_attention (see Note [Fused attention]).
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& attend);

 private:
  BertConfig config_;
  torch::nn::Linear qkv_{nullptr};  // [3H, H]: rows 0..H-1 the query, then the key, then the value
  torch::nn::Linear attention_dense_{nullptr};
  torch::nn::LayerNorm attention_norm_{nullptr};
  torch::nn::Linear intermediate_{nullptr};
  torch::nn::Linear output_dense_{nullptr};
  torch::nn::LayerNorm output_norm_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(BertLayer);

/// What the encoder returns.
struct BertEncoderOutput {
  torch::Tensor sequence;  // float [B, S, H]: the last layer's hidden states
  torch::Tensor pooled;    // float [B, H]: tanh(dense(first token)), the pooler's output
};

/// The BERT encoder: embeddings, `encoder.layer.{0..L-1}`, pooler. Hugging Face's `BertModel`.
class BertModelImpl : public torch::nn::Module {
 public:
  explicit BertModelImpl(const BertConfig& config);
  /// input_ids, token_type_ids int64 [B, S]; attention_mask [B, S] (1 for tokens, 0 for padding; any integer or
  /// bool type), or undefined for no padding.
  BertEncoderOutput forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids,
                            const torch::Tensor& attention_mask = {});

  const BertConfig& config() const { return config_; }
  BertEmbeddings embeddings{nullptr};
  /// The encoder layers, in order: the units of --zero-sharding full.
  std::vector<std::shared_ptr<torch::nn::Module>> layers() const;
  /// What each encoder layer runs through (run_unit); null: plainly.
  void set_unit_runner(std::shared_ptr<UnitRunner> runner) { runner_ = std::move(runner); }

 private:
  BertConfig config_;
  torch::nn::ModuleList layers_{nullptr};  // registered as "encoder.layer"
  torch::nn::Linear pooler_{nullptr};      // registered as "pooler.dense"
  std::shared_ptr<UnitRunner> runner_;
};
TORCH_MODULE(BertModel);

/// What the pretraining model returns.
struct BertPreTrainingOutput {
  torch::Tensor mlm_logits;  // float [M, V]: vocabulary logits at the M selected (masked) positions
  torch::Tensor nsp_logits;  // float [B, 2]: is-next (0) / random-next (1) logits
};

/// BERT with its pretraining heads (Hugging Face's `BertForPreTraining`): `bert` (BertModel), the MLM head
/// `cls.predictions` (transform dense + activation + LayerNorm, then a decoder whose weight is the word embedding
/// matrix, tied, plus its own bias `cls.predictions.bias`) and the NSP head `cls.seq_relationship`.
/// Parameters are initialised as BERT does (see init_bert_weights).
class BertForPreTrainingImpl : public torch::nn::Module, public ShardableModel {
 public:
  explicit BertForPreTrainingImpl(const BertConfig& config);

  /// `masked_index` int64 [M]: flattened positions b * S + s where the MLM head is evaluated (only there: the
  /// head's V-wide matrix product is the largest of the model). The other arguments as in BertModel.
  BertPreTrainingOutput forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids,
                                const torch::Tensor& attention_mask, const torch::Tensor& masked_index);

  const BertConfig& config() const { return config_; }
  BertModel bert{nullptr};

  /// The encoder layers (--zero-sharding full, Note [Sharded parameters]); the embeddings, the pooler and the
  /// heads (whose decoder is the word embedding matrix) are the root.
  std::vector<std::shared_ptr<torch::nn::Module>> units() override { return bert->layers(); }
  void set_unit_runner(std::shared_ptr<UnitRunner> runner) override { bert->set_unit_runner(std::move(runner)); }

 private:
  BertConfig config_;
  torch::nn::Linear transform_{nullptr};       // cls.predictions.transform.dense
  torch::nn::LayerNorm transform_norm_{nullptr};  // cls.predictions.transform.LayerNorm
  torch::Tensor decoder_bias_;                 // cls.predictions.bias [V]
  torch::nn::Linear seq_relationship_{nullptr};  // cls.seq_relationship
};
TORCH_MODULE(BertForPreTraining);

/// Where a parameter of Google's layout that this model fuses lives: `...attention.self.query.weight` is rows
/// [0, H) of `...attention.self.qkv.weight`, key rows [H, 2H), value [2H, 3H) (biases likewise). Nothing for
/// other names. See Note [One QKV product].
struct FusedSlice {
  std::string parameter;  // the fused parameter's name
  int64_t part = 0;       // 0 query, 1 key, 2 value: rows [part * H, (part + 1) * H)
};
std::optional<FusedSlice> fused_slice(const std::string& name);

/// BERT's initialisation of every submodule of `module`: Linear and Embedding weights ~ N(0, initializer_range),
/// biases 0, LayerNorm weight 1 and bias 0 (as Google's and HetSeq's code; Google truncates the normal at two
/// standard deviations, PyTorch ports do not, nor does this). Draws from torch's global generator.
void init_bert_weights(torch::nn::Module& module, double initializer_range);

}  // namespace hetseq::bert
