#pragma once
/// The two kinds of input of the checkpoint fuzz harness. See Note [Checkpoint fuzz inputs].

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hetseq::fuzz {

// Note [Checkpoint fuzz inputs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint file is a zip archive whose records carry CRC-32s, which LibTorch (not instrumented, so invisible to
// libFuzzer's coverage) checks before it reads the pickle inside: mutated file bytes mostly exercise the archive
// reader. So an input of fuzz/checkpoint_fuzz.cpp is one of two kinds:
//   a file     any bytes that do not start with the records header: decoded as they are;
//   records    "hetseq-fuzz-records\n", then the records of an archive separated by "\n--record--\n": first the
//              pickle (data.pkl), then the tensors' storages (data/0, data/1, ...). They are written into an archive
//              with correct CRCs, which is decoded, so that mutations reach the unpickler and the decoder's own checks
//              (the checksum, the type and value of every entry).
// fuzz/write_seeds.cpp writes seeds of both kinds from real checkpoints (encode_checkpoint).

/// The bytes to decode for fuzz input `data`: a records input written into an archive, any other input as it is.
std::vector<char> checkpoint_bytes_of_input(const uint8_t* data, size_t size);

/// The records input of checkpoint file `archive` (what write_seeds writes). Throws c10::Error when `archive` is not
/// an archive.
std::string records_input_of(const std::vector<char>& archive);

}  // namespace hetseq::fuzz
