#pragma once
// The checkpoint file's bytes: a Checkpoint encoded as a torch.save archive with its checksum, and
// decoded and verified again. See Note [Checkpoint file] (checkpoint_format.cpp).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hetseq/checkpoint/checkpoint.h"

namespace hetseq {

/// The file's bytes: a torch.save-compatible archive (readable with torch.load in Python) whose
/// `checksum` entry covers every other entry. See Note [Checkpoint file]. Built in memory, with a CPU
/// copy of every tensor that is not a contiguous CPU tensor (tests and tools); save_checkpoint writes
/// the same bytes without holding them (the overload below).
std::vector<char> encode_checkpoint(const Checkpoint& checkpoint);

/// The same bytes as encode_checkpoint, handed to `write` in order as they are made, tensor by tensor:
/// beyond the state it takes at most one tensor's copy of host memory (Note [Streamed save]).
/// `write` returns false once writing failed; the rest is skipped then (the caller reports it).
/// save_checkpoint calls it.
void encode_checkpoint(const Checkpoint& checkpoint, const std::function<bool(const void*, size_t)>& write);

/// Parses and verifies bytes written by encode_checkpoint. Throws hetseq::InputError naming `source`
/// when the bytes are truncated, altered (checksum), of another format version, or incomplete.
Checkpoint decode_checkpoint(const std::vector<char>& bytes, const std::string& source);

namespace detail {

/// The CRC-32 that the file's checksum would give (Note [Checkpoint file]) over the training state's
/// entries (model, optimizer, lr_scheduler) and the position (update count, epoch, offset), reading
/// the tensors where they are. state_digest's number.
int64_t training_state_checksum(const Checkpoint& checkpoint);

}  // namespace detail
}  // namespace hetseq
