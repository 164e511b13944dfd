#pragma once

#include <filesystem>
#include <string>

#include <torch/nn/module.h>

namespace hetseq {

/// Creates `dir` if needed and checks that files can be created in it. Throws hetseq::InputError
/// naming `flag` and the path otherwise. Called before any training work starts.
void ensure_writable_dir(const std::filesystem::path& dir, const std::string& flag);

/// Writes the model's parameters and buffers (by their module path names) to `path` safely: to a
/// temporary file in the same directory, synced, then renamed over `path`, so that a reader never
/// sees a half-written file. Throws hetseq::InputError naming the file on failure.
void save_model(const torch::nn::Module& model, const std::filesystem::path& path);

/// Loads parameters and buffers written by save_model into `model`. Throws hetseq::InputError naming
/// the file when it is missing, unreadable, or does not fit the model (a missing name, a shape).
void load_model(torch::nn::Module& model, const std::filesystem::path& path);

}  // namespace hetseq
