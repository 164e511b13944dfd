#pragma once
// Checkpoint files on disk: written atomically to every name of a save, read back and verified.

#include <filesystem>
#include <vector>

#include <torch/nn/module.h>

#include "hetseq/checkpoint/checkpoint.h"

namespace hetseq {

/// Writes the bytes of encode_checkpoint to each of `paths` atomically (see write_file_atomically):
/// streamed into the first file tensor by tensor, taking at most one tensor's copy of host memory
/// (Note [Streamed save]), then copied to the others. Throws hetseq::InputError naming the file that
/// could not be written; files already written stay. CheckpointManager::write calls it.
void save_checkpoint(const Checkpoint& checkpoint, const std::vector<std::filesystem::path>& paths);

/// Reads and verifies a checkpoint file (decode_checkpoint). Throws hetseq::InputError naming the file.
Checkpoint load_checkpoint(const std::filesystem::path& path);

/// Loads only the model weights of a checkpoint file into `model` (hetseq-eval, tests); see
/// load_model_tensors.
void load_model(torch::nn::Module& model, const std::filesystem::path& path);

}  // namespace hetseq
