// Fuzz harness: the HDF5 shard reader of the bert task (tasks/bert/bert_shard.h) on arbitrary file contents:
// inspect_shard, then, for a shard it accepts, ShardReader::read of a few rows, and the same rows through
// BertDataset::collate, which checks their values. See Note [Fuzz harnesses].
#include <hdf5.h>

#include <algorithm>
#include <vector>

#include "fuzz/harness.h"
#include "fuzz/scratch_file.h"
#include "hetseq/core/error.h"
#include "tasks/bert/bert_dataset.h"
#include "tasks/bert/bert_shard.h"

namespace hetseq::fuzz {
namespace {

/// Rows to read: all of a small shard, else the first two, one in the middle and the last.
std::vector<int64_t> rows_to_read(int64_t n) {
  std::vector<int64_t> rows;
  if (n <= 16) {
    for (int64_t i = 0; i < n; ++i) rows.push_back(i);
  } else {
    rows = {0, 1, n / 2, n - 1};
  }
  return rows;
}

void check_rows(const bert::ShardRows& r, int64_t k, const bert::ShardLayout& layout) {
  const std::vector<int64_t> seq{k, layout.seq_length}, pred{k, layout.max_predictions}, labels{k};
  HETSEQ_ASSERT(r.input_ids.sizes().vec() == seq && r.input_mask.sizes().vec() == seq &&
                    r.segment_ids.sizes().vec() == seq && r.masked_lm_positions.sizes().vec() == pred &&
                    r.masked_lm_ids.sizes().vec() == pred && r.next_sentence_labels.sizes().vec() == labels,
                "ShardReader::read of {} rows returned tensors of other shapes than the layout [{}, {}], P {}", k,
                layout.num_samples, layout.seq_length, layout.max_predictions);
}

}  // namespace

Outcome run_input(const uint8_t* data, size_t size) {
  static ScratchFile file("shard.h5");
  const std::string& path = file.write(data, size);
  const Outcome outcome = run_expecting<InputError>([&] {
    const bert::ShardLayout layout = bert::inspect_shard(path);
    HETSEQ_ASSERT(layout.path == path && layout.num_samples > 0 && layout.seq_length >= 2 &&
                      layout.max_predictions >= 1,
                  "inspect_shard accepted a layout of N {}, S {}, P {}", layout.num_samples, layout.seq_length,
                  layout.max_predictions);
    const bert::ShardReader reader(layout);
    const std::vector<int64_t> rows = rows_to_read(layout.num_samples);
    check_rows(reader.read(rows), static_cast<int64_t>(rows.size()), layout);
    bert::BertDataOptions options;
    options.files = {path};
    const bert::BertDataset dataset(options);
    const Batch batch = dataset.collate(rows);
    HETSEQ_ASSERT(batch.num_samples == static_cast<int64_t>(rows.size()), "collate of {} rows gave {} samples",
                  rows.size(), batch.num_samples);
  });
  HETSEQ_ASSERT(outcome.accepted || outcome.rejection.find(path) != std::string::npos,
                "the shard reader's error does not name the file {}: {}", path, outcome.rejection);
  // A reader that leaves an HDF5 object open leaks it on every shard a long run opens, and HDF5 would hand the
  // stale open file to the next H5Fopen of the same path.
  const ssize_t open_objects = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  HETSEQ_ASSERT(open_objects == 0, "the shard reader left {} HDF5 objects open", open_objects);
  return outcome;
}

}  // namespace hetseq::fuzz
