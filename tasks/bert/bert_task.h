#pragma once
/// The `bert` task: BERT pretraining (masked LM + next sentence prediction) on HetSeq's HDF5 shards
/// (`--task bert`), with HetSeq's flags `--config_file`, `--dict`, `--max_pred_length`, `--num_file` and
/// `--init-from` to start from Hugging Face weights.

#include <map>
#include <memory>
#include <string>

#include "hetseq/task/task.h"
#include "tasks/bert/bert_config.h"
#include "tasks/bert/bert_model.h"

namespace hetseq::bert {

/// What a BERT step logs besides the library's metrics (all summed on the device; `ntokens` counts the
/// masked tokens, `nll_loss` is their summed cross-entropy).
inline constexpr Metric kMlmLossSum{"mlm_loss_sum"};  // per-sequence mean masked-LM losses, summed
inline constexpr Metric kNspLossSum{"nsp_loss_sum"};  // next-sentence losses, summed
inline constexpr Metric kMlmCorrect{"mlm_correct"};   // masked tokens predicted right
inline constexpr Metric kNspCorrect{"nsp_correct"};   // next-sentence labels predicted right

/// What the bert task is built from (the task factory fills it from the command line).
struct BertTaskOptions {
  std::string data;                   // --data: a shard or a directory of shards
  std::string train_subset = "train";  // --train-subset (only to name the flag in messages)
  BertConfig config;                  // from --config_file
  std::string config_file;            // --config_file
  std::string dict;                   // --dict: vocab.txt, one token a line; empty: not checked
  int64_t max_pred_length = 512;      // --max_pred_length
  int64_t num_file = 0;               // --num_file: the first N shards of a split (0: all)
  std::string init_from;              // --init-from: Hugging Face weights (file or directory); empty: none
  bool static_shapes = false;         // batches of one shape (--cuda-graph): Note [Static BERT batches]
};

/// The number of tokens of a vocab file (its lines, as HetSeq counts them). Throws hetseq::InputError naming --dict
/// when the file cannot be read or is empty.
int64_t count_vocab(const std::string& path);

/// The batch's `input_mask`, or an undefined tensor when the collate left it out (no padding in the batch).
torch::Tensor input_mask_of(const Batch& batch);

// Note [BERT loss and sample size]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The sample is a sequence pair ("sentence" in HetSeq's logs): sample_size = nsentences, as HetSeq counts it.
// The loss of sequence i is
//     L_i = (1 / m_i) * sum_{masked positions p of i} CE(MLM logits at p, true token)  +  CE(NSP logits of i)
// (the MLM term is 0 for a sequence with m_i = 0 masked tokens), and compute_loss returns sum_i L_i. The
// Controller divides by the number of sequences of the whole update (Note [Weighted averaging]), so the update
// minimises the mean over sequences of "mean MLM loss of the sequence + NSP loss": BERT's objective, except that
// Google averages the MLM term over the masked tokens of the whole batch rather than per sequence (the two agree
// when every sequence has the same number of masked tokens, as they nearly do with a 15% masking rate). Unlike a
// per-batch token mean, it does not depend on how the batch is split across ranks, which is what heterogeneous
// batches need. For logging, `nll_loss` is the MLM cross-entropy summed over masked tokens and `ntokens` their
// count, so `nll_loss` and `ppl` are the MLM's per-token loss and perplexity; `mlm_loss` and `nsp_loss` (derived,
// base 2 like `loss`) add up to `loss`. The masked positions arrive with the batch (`masked_lm_index`, found on
// the host by collate, before the batch goes to the device), so neither the loss nor `ntokens` makes the host
// wait for the device: finding them on the device (nonzero) would, every step.

/// The task. See Note [BERT loss and sample size] for what compute_loss returns.
class BertTask : public Task {
 public:
  /// Checks --data exists and --dict against the config's vocab_size (more tokens than vocab_size is an error,
  /// fewer a warning: vocabularies are often padded). Throws hetseq::UsageError / InputError naming the flag.
  explicit BertTask(BertTaskOptions options);

  /// A BertForPreTraining with BERT's initialisation, then the --init-from weights if given.
  std::shared_ptr<torch::nn::Module> build_model() override;
  /// The shards of `split` (find_shards) as a BertDataset.
  std::shared_ptr<Dataset> load_dataset(const std::string& split) override;
  /// `model` must be a BertForPreTrainingImpl.
  StepOutput compute_loss(torch::nn::Module& model, const Batch& batch) override;
  /// `mlm_loss`, `nsp_loss` (base 2, per sequence), `mlm_accuracy` and `nsp_accuracy` (percent).
  std::vector<Ratio> ratios() const override;

  const BertTaskOptions& options() const { return options_; }

 private:
  BertTaskOptions options_;
};

}  // namespace hetseq::bert
