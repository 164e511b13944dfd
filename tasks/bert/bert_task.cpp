#include "tasks/bert/bert_task.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <utility>

#include <torch/nn/functional/loss.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/parse.h"
#include "hetseq/task/task_registry.h"
#include "tasks/bert/bert_dataset.h"
#include "tasks/bert/hf_weights.h"

namespace hetseq::bert {
namespace {

namespace F = torch::nn::functional;


}  // namespace

torch::Tensor input_mask_of(const Batch& batch) {
  const auto it = batch.fields.find("input_mask");
  return it == batch.fields.end() ? torch::Tensor() : it->second;
}

int64_t count_vocab(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("--dict {}: cannot read the vocabulary file", path));
  int64_t lines = 0;
  std::string line;
  while (std::getline(in, line)) ++lines;
  if (lines == 0) throw InputError(fmt::format("--dict {}: the vocabulary file is empty", path));
  return lines;
}

BertTask::BertTask(BertTaskOptions options) : options_(std::move(options)) {
  if (options_.max_pred_length <= 0) {
    throw UsageError(fmt::format("--max_pred_length must be positive, got {}", options_.max_pred_length));
  }
  if (options_.num_file < 0) throw UsageError(fmt::format("--num_file must be 0 (all) or positive, got {}", options_.num_file));
  if (!options_.dict.empty()) {
    const int64_t tokens = count_vocab(options_.dict);
    if (tokens > options_.config.vocab_size) {
      throw InputError(fmt::format("--dict {} has {} tokens, more than vocab_size {} of --config_file {}; use the "
                                   "vocabulary the config was made for",
                                   options_.dict, tokens, options_.config.vocab_size, options_.config_file));
    }
    if (tokens < options_.config.vocab_size) {
      log::warn("[bert] --dict {} has {} tokens, vocab_size of --config_file is {} (padded vocabulary)", options_.dict,
                tokens, options_.config.vocab_size);
    }
  }
}

std::shared_ptr<torch::nn::Module> BertTask::build_model() {
  auto model = BertForPreTraining(options_.config).ptr();
  if (!options_.init_from.empty()) {
    const LoadReport report = load_hf_weights(*model, find_weights_file(options_.init_from));
    log::info("[bert] --init-from {}: {} tensors loaded, {} parameters kept as initialised{}{}, {} file tensors "
              "ignored",
              report.file, report.loaded.size(), report.missing.size(), report.missing.empty() ? "" : ": ",
              fmt::join(report.missing, ", "), report.unexpected.size());
  }
  return model;
}

std::shared_ptr<Dataset> BertTask::load_dataset(const std::string& split) {
  BertDataOptions data;
  const std::string flag = split == options_.train_subset ? "--train-subset" : "--valid-subset";
  data.files = find_shards(options_.data, split, options_.num_file, flag);
  data.vocab_size = options_.config.vocab_size;
  data.type_vocab_size = options_.config.type_vocab_size;
  data.max_position_embeddings = options_.config.max_position_embeddings;
  data.max_pred_length = options_.max_pred_length;
  data.static_shapes = options_.static_shapes;
  auto dataset = std::make_shared<BertDataset>(std::move(data));
  log::info("[bert] split '{}': {} sequences of {} tokens in {} shard(s) from {}", split, dataset->size(),
            dataset->seq_length(), dataset->shards().size(), options_.data);
  return dataset;
}

StepOutput BertTask::compute_loss(torch::nn::Module& model, const Batch& batch) {
  auto* net = dynamic_cast<BertForPreTrainingImpl*>(&model);
  HETSEQ_ASSERT(net != nullptr, "the bert task got a model that is not a BertForPreTraining ({})", model.name());
  StepOutput out;
  const double n = static_cast<double>(batch.num_samples);
  out.sample_size = n;
  out.add(metrics::kNsentences, n);
  // See Note [BERT loss and sample size].
  const torch::Tensor& labels = batch.at("masked_lm_labels");  // [B, S]
  const int64_t b = labels.size(0), s = labels.size(1);
  // The masked positions and their targets come with the batch, found on the host at collate time: nonzero
  // here would wait for the device every step. A batch built without targets (a test's) takes them here.
  const torch::Tensor& masked = batch.at("masked_lm_index");  // [M] flat positions b * S + s
  const auto given = batch.fields.find("masked_lm_targets");
  const torch::Tensor targets = given != batch.fields.end() ? given->second
                                                            : labels.reshape({-1}).index_select(0, masked);  // [M]
  // Padded to a fixed count (Note [Static BERT batches]): the extra entries have target -1 and count for nothing.
  const bool padded = options_.static_shapes;
  const torch::Tensor sequence_of = masked.div(s, "floor");  // [M]
  const BertPreTrainingOutput pred =
      net->forward(batch.at("input_ids"), batch.at("segment_ids"), input_mask_of(batch), masked);

  // float32 logits whatever the autocast dtype, for the loss and the accuracy.
  const torch::Tensor mlm_logits = pred.mlm_logits.to(torch::kFloat32);  // [M, vocab]
  const auto float_options = mlm_logits.options();
  auto ce = F::CrossEntropyFuncOptions().reduction(torch::kNone);
  if (padded) ce.ignore_index(-1);
  const torch::Tensor token_loss = F::cross_entropy(mlm_logits, targets, ce);  // [M], 0 where ignored
  const torch::Tensor counted = padded ? targets.ne(-1).to(float_options.dtype()) : torch::ones_like(token_loss);
  const torch::Tensor per_sequence_sum = torch::zeros({b}, float_options).index_add(0, sequence_of, token_loss);
  const torch::Tensor per_sequence_count = torch::zeros({b}, float_options).index_add(0, sequence_of, counted);
  const torch::Tensor mlm = (per_sequence_sum / per_sequence_count.clamp_min(1)).sum();
  const torch::Tensor& nsp_labels = batch.at("next_sentence_labels");
  const torch::Tensor nsp = F::cross_entropy(pred.nsp_logits.to(torch::kFloat32), nsp_labels,
                                             F::CrossEntropyFuncOptions().reduction(torch::kSum));
  out.loss = mlm + nsp;

  torch::NoGradGuard no_grad;
  // Losses and correct counts stay on the device, read once per update (Note [Statistics on the device]);
  // the number of masked tokens is known on the host already (the size of masked_lm_index).
  if (padded) {
    // Host statistics that depend on the batch's shape only (a replayed CUDA graph keeps the captured ones):
    // the real masked tokens counted on the device. See Note [CUDA-graph updates].
    out.add(metrics::kNtokens, targets.ne(-1).sum());
  } else {
    out.add(metrics::kNtokens, static_cast<double>(masked.size(0)));
  }
  out.add(metrics::kLoss, out.loss.detach());
  out.add(kMlmLossSum, mlm.detach());
  out.add(kNspLossSum, nsp.detach());
  out.add(metrics::kNllLoss, token_loss.detach().sum());
  // Correct when the target's logit is the largest (a tie counts as correct): a vectorised max and a gather,
  // where argmax over the vocabulary runs a scalar loop that cost 6-10% of a tiny-BERT update.
  const torch::Tensor target_logit = mlm_logits.gather(1, (padded ? targets.clamp_min(0) : targets).unsqueeze(1)).squeeze(1);
  const torch::Tensor correct = target_logit.ge(mlm_logits.amax(1));
  out.add(kMlmCorrect, (padded ? correct.logical_and(targets.ne(-1)) : correct).sum());
  out.add(kNspCorrect, pred.nsp_logits.argmax(1).eq(nsp_labels).sum());
  return out;
}

std::vector<Ratio> BertTask::ratios() const {
  return {{"mlm_loss", kMlmLossSum, metrics::kNsentences, 1 / kLn2},
          {"nsp_loss", kNspLossSum, metrics::kNsentences, 1 / kLn2},
          {"nsp_accuracy", kNspCorrect, metrics::kNsentences, 100},
          {"mlm_accuracy", kMlmCorrect, metrics::kNtokens, 100}};
}

namespace {

TaskSpec make_bert_spec() {
  TaskSpec spec;
  spec.name = "bert";
  spec.description = "BERT pretraining (masked LM + next sentence) on HetSeq's HDF5 shards";
  spec.flag_group = "BERT task";
  spec.flags = [](FlagSet& flags) {
    flags.add("config_file", "BERT config (Google's bert_config.json keys), e.g. configs/bert-base-uncased.json", "",
              "FILE")
        .add("dict", "the vocabulary (vocab.txt, one token a line), checked against the config's vocab_size", "",
             "FILE")
        .add("max_pred_length", "at most this many masked positions of a sequence are used", "512", "N")
        .add("num_file", "use only the first N shards of each split (0: all)", "0", "N")
        .add("init-from",
             "start from pretrained BERT weights in Hugging Face's layout (a directory with model.safetensors or "
             "pytorch_model.bin, or the file)",
             "", "PATH");
  };
  spec.defaults = {{"valid-subset", "test"}};
  spec.create = [](const FlagValues& args, const TaskContext& context) -> std::unique_ptr<Task> {
    BertTaskOptions o;
    o.data = args.text_or("data", "");
    o.train_subset = args.text_or("train-subset", "train");
    o.config_file = args.text("config_file");
    if (o.config_file.empty()) {
      throw UsageError("--config_file is required for --task bert: a bert_config.json, e.g. configs/bert-base-uncased.json");
    }
    o.dict = args.text("dict");
    o.max_pred_length = args.integer("max_pred_length");
    o.num_file = args.integer("num_file");
    o.init_from = args.text("init-from");
    o.static_shapes = context.static_shapes;
    o.config = read_bert_config(o.config_file);
    if (o.data.empty()) {
      throw UsageError("--data is required for --task bert: an HDF5 shard or a directory of shards");
    }
    return std::make_unique<BertTask>(std::move(o));
  };
  return spec;
}

}  // namespace

HETSEQ_REGISTER_TASK(bert, make_bert_spec);

}  // namespace hetseq::bert
