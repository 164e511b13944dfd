#include "tasks/bert/bert_dataset.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq::bert {
namespace {

namespace fs = std::filesystem;

/// Throws naming the file, dataset and row when some value of `values` [k, w] lies outside [low, high).
void check_range(const std::string& path, const char* dataset, const torch::Tensor& values,
                 const std::vector<int64_t>& rows, int64_t low, int64_t high, const std::string& meaning) {
  if (values.numel() == 0) return;
  const torch::Tensor bad = values.lt(low).logical_or(values.ge(high));
  if (!bad.any().item<bool>()) return;
  const torch::Tensor where = bad.nonzero()[0];  // [row in batch, column]
  const int64_t r = where[0].item<int64_t>();
  const int64_t value = values.dim() == 2 ? values[r][where[1].item<int64_t>()].item<int64_t>() : values[r].item<int64_t>();
  throw InputError(fmt::format("{}: dataset '{}' row {} holds {}, outside [{}, {}) ({}); was the shard made for "
                               "another model or vocabulary?",
                               path, dataset, rows[static_cast<size_t>(r)], value, low, high, meaning));
}

}  // namespace

std::vector<std::string> find_shards(const std::string& data, const std::string& split, int64_t num_file,
                                     const std::string& split_flag) {
  std::error_code ec;
  if (data.empty()) {
    throw UsageError("--data: the bert task needs an HDF5 shard or a directory of them (see scripts/train_bert.sh)");
  }
  if (!fs::exists(data, ec)) {
    throw InputError(fmt::format("--data {}: no such file or directory; give an HDF5 shard or a directory of shards "
                                 "made by scripts/bert_preprocess.py",
                                 data));
  }
  if (!fs::is_directory(data, ec)) return {data};
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(data, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    if (entry.path().filename().string().find(split) != std::string::npos) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (num_file > 0 && static_cast<int64_t>(files.size()) > num_file) files.resize(static_cast<size_t>(num_file));
  if (files.empty()) {
    throw InputError(fmt::format("--data {}: no file whose name contains '{}' ({}); name the shards of a split "
                                 "after it, e.g. bert_{}_0.hdf5",
                                 data, split, split_flag, split));
  }
  return files;
}

torch::Tensor masked_lm_index(const torch::Tensor& labels) {
  HETSEQ_ASSERT(labels.dim() == 2, "masked_lm_labels must be [n, S], got {} dimensions", labels.dim());
  return labels.reshape({-1}).ne(-1).nonzero().squeeze(1);
}

BertDataset::BertDataset(BertDataOptions options) : options_(std::move(options)) {
  HETSEQ_ASSERT(!options_.files.empty(), "a BERT split needs at least one shard");
  HETSEQ_ASSERT(options_.open_files > 0, "open_files must be positive");
  for (const std::string& file : options_.files) {
    ShardLayout layout = inspect_shard(file);
    if (layouts_.empty()) {
      seq_length_ = layout.seq_length;
      if (seq_length_ > options_.max_position_embeddings) {
        throw InputError(fmt::format("{}: sequences of {} tokens, but the model's max_position_embeddings is {} "
                                     "(--config_file); preprocess with a shorter max_seq_length",
                                     file, seq_length_, options_.max_position_embeddings));
      }
    } else if (layout.seq_length != seq_length_) {
      throw InputError(fmt::format("{}: sequences of {} tokens, but {} has {}; the shards of a split must share "
                                   "max_seq_length",
                                   file, layout.seq_length, layouts_.front().path, seq_length_));
    }
    total_ += layout.num_samples;
    ends_.push_back(total_);
    max_predictions_ = std::max(max_predictions_, std::min(layout.max_predictions, options_.max_pred_length));
    layouts_.push_back(std::move(layout));
  }
}

std::shared_ptr<const ShardReader> BertDataset::reader(size_t shard) const {
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->first == shard) {
      open_.splice(open_.begin(), open_, it);
      return open_.front().second;
    }
  }
  if (open_.size() >= options_.open_files) open_.pop_back();
  open_.emplace_front(shard, std::make_shared<const ShardReader>(layouts_[shard]));
  return open_.front().second;
}

void BertDataset::check_values(size_t shard, const ShardRows& d, const std::vector<int64_t>& rows) const {
  const std::string& path = layouts_[shard].path;
  const int64_t v = options_.vocab_size;
  check_range(path, "input_ids", d.input_ids, rows, 0, v, fmt::format("vocab_size {} of --config_file", v));
  check_range(path, "masked_lm_ids", d.masked_lm_ids, rows, 0, v, fmt::format("vocab_size {} of --config_file", v));
  check_range(path, "segment_ids", d.segment_ids, rows, 0, options_.type_vocab_size,
              fmt::format("type_vocab_size {} of --config_file", options_.type_vocab_size));
  check_range(path, "input_mask", d.input_mask, rows, 0, 2, "1 for a token, 0 for padding");
  check_range(path, "masked_lm_positions", d.masked_lm_positions, rows, 0, seq_length_,
              fmt::format("positions inside a sequence of {} tokens", seq_length_));
  check_range(path, "next_sentence_labels", d.next_sentence_labels, rows, 0, 2, "0: is next, 1: random");
  // A row must start with a token ([CLS]): attention over a row with no token at all is undefined (NaN).
  if (d.input_mask.numel() > 0) {
    const torch::Tensor empty = d.input_mask.select(1, 0).ne(1);
    if (empty.any().item<bool>()) {
      const int64_t r = empty.nonzero()[0][0].item<int64_t>();
      throw InputError(fmt::format("{}: dataset 'input_mask' row {} starts with 0, so the row has no tokens; every "
                                   "sequence starts with [CLS]",
                                   path, rows[static_cast<size_t>(r)]));
    }
  }
}

Batch BertDataset::collate(const std::vector<int64_t>& indices) const {
  const auto n = static_cast<int64_t>(indices.size());
  const int64_t s = seq_length_;
  torch::Tensor input_ids = torch::zeros({n, s}, torch::kInt64);
  torch::Tensor segment_ids = torch::zeros({n, s}, torch::kInt64);
  torch::Tensor input_mask = torch::zeros({n, s}, torch::kInt64);
  torch::Tensor labels = torch::full({n, s}, -1, torch::kInt64);
  torch::Tensor next_sentence = torch::zeros({n}, torch::kInt64);

  // [shard] -> (row in the shard, position in the batch)
  std::map<size_t, std::vector<std::pair<int64_t, int64_t>>> by_shard;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index = indices[static_cast<size_t>(i)];
    HETSEQ_ASSERT(index >= 0 && index < total_, "sample index {} outside the BERT split of {} sequences", index, total_);
    const auto shard = static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), index) - ends_.begin());
    const int64_t begin = shard == 0 ? 0 : ends_[shard - 1];
    by_shard[shard].emplace_back(index - begin, i);
  }
  auto labels_a = labels.accessor<int64_t, 2>();
  for (auto& [shard, wanted] : by_shard) {
    std::sort(wanted.begin(), wanted.end());
    std::vector<int64_t> rows;             // distinct, ascending
    std::vector<int64_t> source, target;   // [wanted] row of `rows`, position in the batch
    for (const auto& [row, position] : wanted) {
      if (rows.empty() || rows.back() != row) rows.push_back(row);
      source.push_back(static_cast<int64_t>(rows.size()) - 1);
      target.push_back(position);
    }
    ShardRows data;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const std::shared_ptr<const ShardReader> open = reader(shard);
      if (open->mapped()) lock.unlock();  // no HDF5 call: the loader's threads read at once (Note [Mapped shards])
      data = open->read(rows);
    }
    check_values(shard, data, rows);
    const torch::Tensor from = torch::tensor(source, torch::kInt64);
    const torch::Tensor to = torch::tensor(target, torch::kInt64);
    input_ids.index_copy_(0, to, data.input_ids.index_select(0, from));
    segment_ids.index_copy_(0, to, data.segment_ids.index_select(0, from));
    input_mask.index_copy_(0, to, data.input_mask.index_select(0, from));
    next_sentence.index_copy_(0, to, data.next_sentence_labels.index_select(0, from));
    // HetSeq's labels: the masked positions are those before the first position 0 (the padding), at most
    // --max_pred_length of them.
    const int64_t usable = std::min(layouts_[shard].max_predictions, options_.max_pred_length);
    auto positions = data.masked_lm_positions.accessor<int64_t, 2>();
    auto ids = data.masked_lm_ids.accessor<int64_t, 2>();
    for (size_t k = 0; k < source.size(); ++k) {
      const int64_t r = source[k], b = target[k];
      for (int64_t j = 0; j < usable && positions[r][j] != 0; ++j) labels_a[b][positions[r][j]] = ids[r][j];
    }
  }
  Batch batch;
  batch.fields.emplace("input_ids", input_ids);
  batch.fields.emplace("segment_ids", segment_ids);
  // No padding in the whole batch: no mask, so that attention may take its fastest kernel (Note [Fused
  // attention]). Decided here, on the host, where it costs no wait for the device.
  if (options_.static_shapes || n == 0 || !input_mask.all().item<bool>()) batch.fields.emplace("input_mask", input_mask);
  torch::Tensor index = masked_lm_index(labels);                          // [M]
  torch::Tensor targets = labels.reshape({-1}).index_select(0, index);    // [M]
  if (options_.static_shapes) {  // See Note [Static BERT batches].
    const int64_t padding = n * max_predictions_ - index.size(0);
    HETSEQ_ASSERT(padding >= 0, "{} masked tokens in a batch of {} sequences of at most {} each", index.size(0), n,
                  max_predictions_);
    index = torch::cat({index, torch::zeros({padding}, torch::kInt64)});
    targets = torch::cat({targets, torch::full({padding}, -1, torch::kInt64)});
  }
  batch.fields.emplace("masked_lm_index", index);
  batch.fields.emplace("masked_lm_targets", targets);
  batch.fields.emplace("masked_lm_labels", labels);
  batch.fields.emplace("next_sentence_labels", next_sentence);
  batch.num_samples = n;
  return batch;
}

}  // namespace hetseq::bert
