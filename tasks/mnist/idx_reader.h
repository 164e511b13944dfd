#pragma once
/// Reading the IDX files of MNIST and Fashion-MNIST (`train-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`,
/// ...), gzipped (`.gz`) or plain. See Note [IDX format].

#include <string>

#include <torch/types.h>

namespace hetseq::mnist {

// Note [IDX format]
// ~~~~~~~~~~~~~~~~~
// An IDX file is a big-endian header followed by the data, row-major:
//   bytes 0-1  zero
//   byte  2    element type (0x08 = unsigned byte, the only type MNIST uses)
//   byte  3    number of dimensions d
//   then d big-endian uint32 sizes, then prod(sizes) elements.
// So an image file starts with the magic number 0x00000803 ([N, rows, cols]) and a label file with
// 0x00000801 ([N]). Files may be gzipped; zlib reads plain files through the same calls. The readers
// below check the magic number, the sizes, a short read (a truncated download) and trailing bytes, and
// report each as a hetseq::InputError naming the file.

/// Reads an IDX image file (magic 0x00000803). Returns uint8 [N, rows, cols]. Throws hetseq::InputError
/// naming `path` when the file is missing, is not an IDX image file, or is truncated or too long.
torch::Tensor read_idx_images(const std::string& path);

/// Reads an IDX label file (magic 0x00000801). Returns int64 [N]. Throws hetseq::InputError naming `path`
/// like read_idx_images.
torch::Tensor read_idx_labels(const std::string& path);

}  // namespace hetseq::mnist
