#pragma once
/// A split of BERT pretraining data: HDF5 shards (tasks/bert/bert_shard.h) read row by row on demand.

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hetseq/data/dataset.h"
#include "tasks/bert/bert_shard.h"

namespace hetseq::bert {

/// The shards of `split` under `data` as HetSeq finds them: `data` itself when it is a file, else the files of the
/// directory `data` whose names contain `split`, sorted by name, the first `num_file` of them when num_file > 0.
/// Throws hetseq::InputError naming --data, the split and `split_flag` (--train-subset or --valid-subset) when
/// `data` does not exist or no file matches.
std::vector<std::string> find_shards(const std::string& data, const std::string& split, int64_t num_file,
                                     const std::string& split_flag);

/// Limits the values of a shard are checked against (from the model's config and --max_pred_length).
struct BertDataOptions {
  std::vector<std::string> files;       // the shards, in order
  int64_t vocab_size = 30522;           // token ids must be below (config's vocab_size)
  int64_t type_vocab_size = 2;          // segment ids must be below
  int64_t max_position_embeddings = 512;  // sequences may not be longer
  int64_t max_pred_length = 512;        // --max_pred_length: at most this many masked positions are used per row
  size_t open_files = 16;               // shards kept open at once (least recently used closed first)
  /// Every batch of n sequences gets the same fields and shapes (Note [Static BERT batches]).
  bool static_shapes = false;
};

// Note [Static BERT batches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A batch's masked positions vary in number (BERT masks 15% of a pair's tokens, at most max_predictions), and
// `input_mask` is left out when nothing is padded; a step replayed from a CUDA graph needs the same shapes every
// time. With static_shapes, `input_mask` is always there, and the masked positions are padded to n * P (P: the
// largest number a shard holds per sequence, at most --max_pred_length), the extra entries at flat position 0
// with target -1. The loss ignores a target of -1 (its cross-entropy, count and correct count are 0), so the
// loss and the gradients equal the unpadded batch's, up to the order in which the products over the masked rows
// are summed (tests/bert/test_bert_task.cpp states the tolerance). The task then counts the real masked tokens
// (`ntokens`) on the device: a batch's host statistics must depend on its shape only (Note [CUDA-graph
// updates]), and the loss takes the padded path for every batch, so that a captured graph holds the path that
// every replay needs.

// Note [BERT shards in memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A BERT corpus is far larger than memory, and the epoch order (Note [Data plan]) is one permutation over the
// whole split, so a batch draws rows from many shards. The dataset therefore keeps only each shard's shape
// (read once when the split is loaded, which also checks the structure of every shard) and reads exactly the rows
// a batch needs: per shard touched, one HDF5 read per dataset selecting those rows, or for a contiguous shard
// (scripts/bert_preprocess.py's) a copy of those rows from the file mapped read-only (Note [Mapped shards],
// bert_shard.cpp; the page cache holds what was read), so the process's own memory stays at a batch's worth of
// rows plus at most `open_files` open files. collate() runs on the loader's background threads (--num-workers),
// so the reads of the next batches overlap the training step, and on mapped shards they run at once. The values of every row read
// are checked (ids inside the vocabulary, masks 0/1 with a token first, positions inside the sequence, labels
// 0/1); a bad row is an hetseq::InputError naming the file, the dataset and the row.

/// The flat positions b * S + s of the masked tokens of `labels` [n, S] (where it is not -1), ascending: [M] int64.
/// Computed on the host when a batch is collated, so that the loss needs no host-device synchronisation to
/// find them (Note [BERT loss and sample size]).
torch::Tensor masked_lm_index(const torch::Tensor& labels);

/// The split. Batches hold (int64) `input_ids`, `segment_ids`, `input_mask` [n, S] (left out when no sequence of
/// the batch is padded: then attention needs no mask), `masked_lm_labels` [n, S]
/// (the true id at masked positions, -1 elsewhere, as HetSeq builds it), `masked_lm_index` [M] (see
/// masked_lm_index; a batch-level field: M counts the masked tokens of the whole batch), `masked_lm_targets` [M]
/// (the true ids there, found on the host) and `next_sentence_labels` [n]. See
/// Note [BERT shards in memory], and Note [Static BERT batches] for static_shapes.
class BertDataset : public Dataset {
 public:
  /// Inspects every shard (see inspect_shard); throws hetseq::InputError naming the file when one is malformed,
  /// when shards disagree on the sequence length, or when it exceeds max_position_embeddings.
  explicit BertDataset(BertDataOptions options);

  int64_t size() const override { return total_; }
  /// Reads and checks the rows of `indices`. Thread-safe.
  Batch collate(const std::vector<int64_t>& indices) const override;

  const std::vector<ShardLayout>& shards() const { return layouts_; }
  int64_t seq_length() const { return seq_length_; }

 private:
  /// The open reader of shard `shard`, opening it (and closing the least recently used) if needed. Needs mutex_.
  std::shared_ptr<const ShardReader> reader(size_t shard) const;
  /// Checks the values of rows read from shard `shard`; `rows` are their row numbers in the file.
  void check_values(size_t shard, const ShardRows& data, const std::vector<int64_t>& rows) const;

  BertDataOptions options_;
  std::vector<ShardLayout> layouts_;  // [shard]
  std::vector<int64_t> ends_;         // [shard] index one past the shard's last sample
  int64_t max_predictions_ = 0;       // the most masked positions a sequence can have (static_shapes)
  int64_t total_ = 0;
  int64_t seq_length_ = 0;
  mutable std::mutex mutex_;
  // Most recently used first; shared, so that a mapped reader being read outside the lock outlives its closing.
  mutable std::list<std::pair<size_t, std::shared_ptr<const ShardReader>>> open_;
};

}  // namespace hetseq::bert
