#pragma once
// Files for BERT tests: HDF5 shards written with the HDF5 C API, well-formed or broken in one chosen way, and
// safetensors files of weights.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

namespace hetseq::test {

/// One dataset of a shard: its shape, values (row-major), whether to store them as floats, and whether to store them
/// in gzip-compressed chunks (as NVIDIA's preprocessing does) instead of one contiguous block.
struct ShardArray {
  std::vector<int64_t> shape;
  std::vector<int64_t> values;
  bool as_float = false;
  bool gzip = false;
};

/// A well-formed shard of `n` sequences of `seq_length` tokens with `max_predictions` masked slots: row i has
/// tokens 101, 1000 + i, 1001 + i, ..., 102 (the rest padding), segment ids 0/1 halves, masked positions 1 and 2
/// (ids 2000 + i, 2001 + i), then position 0 as padding, and next-sentence label i % 2.
std::map<std::string, ShardArray> make_shard(int64_t n, int64_t seq_length = 16, int64_t max_predictions = 4);

/// Writes `datasets` to a new HDF5 file at `path` (int32 or float64 elements; gzip-compressed chunks of up to 4 rows
/// where ShardArray::gzip says so).
void write_shard(const std::string& path, const std::map<std::string, ShardArray>& datasets);

/// Writes `tensors` as a safetensors file, each converted to float32.
void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors);

}  // namespace hetseq::test
