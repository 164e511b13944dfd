#pragma once
/// One HDF5 shard of BERT pretraining data in the layout of NVIDIA's and HetSeq's preprocessing, read row by row.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace hetseq::bert {

/// The six datasets of a shard, in HetSeq's order. Each holds one row per sequence pair:
///   input_ids [N, S], input_mask [N, S], segment_ids [N, S]     token ids, 1/0 for token/padding, sentence A/B
///   masked_lm_positions [N, P], masked_lm_ids [N, P]            positions of the masked tokens and their true ids,
///                                                                padded with position 0 after the last one
///   next_sentence_labels [N] (or [N, 1])                        0: B follows A, 1: B is a random sentence
/// Any integer type is accepted (NVIDIA's scripts write int32 and int8).
const std::vector<std::string>& shard_dataset_names();

/// The shape of a shard, as checked by inspect_shard.
struct ShardLayout {
  std::string path;
  int64_t num_samples = 0;      // N
  int64_t seq_length = 0;       // S
  int64_t max_predictions = 0;  // P
};

/// Opens `path` and checks its structure: every dataset of shard_dataset_names() present, integer-typed, of the
/// rank and sizes above, all with the same N. Throws hetseq::InputError naming the file and the dataset otherwise.
/// Reads no rows.
ShardLayout inspect_shard(const std::string& path);

/// Rows of a shard, as read (values not yet checked), int64.
struct ShardRows {
  torch::Tensor input_ids;             // [k, S]
  torch::Tensor input_mask;            // [k, S]
  torch::Tensor segment_ids;           // [k, S]
  torch::Tensor masked_lm_positions;   // [k, P]
  torch::Tensor masked_lm_ids;         // [k, P]
  torch::Tensor next_sentence_labels;  // [k]
};

/// An open shard. Reads are serialised by the HDF5 library (built thread-safe on Debian); use one object from
/// several threads only through BertDataset, which locks, except when mapped(): then read() makes no HDF5 call
/// and may run on several threads at once (Note [Mapped shards], tasks/bert/bert_shard.cpp).
class ShardReader {
 public:
  explicit ShardReader(ShardLayout layout);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  /// Reads the rows `rows` (ascending, distinct, each in [0, N)) of every dataset with one HDF5 read per dataset.
  /// The first read that reaches a compressed chunk checks that it inflates to a chunk's size (Note [Short chunks]);
  /// a damaged chunk is a hetseq::InputError naming the file, the dataset and the row.
  ShardRows read(const std::vector<int64_t>& rows) const;
  const ShardLayout& layout() const { return layout_; }
  /// Whether the rows are read from the file mapped into memory (every dataset contiguous and unfiltered).
  bool mapped() const;

 private:
  void map_file();
  struct Chunks;  // the chunks checked so far, per dataset
  ShardLayout layout_;
  int64_t file_ = -1;  // hid_t of the open file
  std::unique_ptr<Chunks> chunks_;  // changed by read(), which callers serialise (see above)
};

}  // namespace hetseq::bert
