#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace hetseq {

/// The data plan a checkpoint was written under (see Note [Data plan]): on resume it is compared with
/// the new one, which may differ (another cluster).
struct SavedDataPlan {
  std::vector<int64_t> batch_sizes;   // [rank]
  std::vector<int64_t> update_freqs;  // [rank], for the epoch being trained
  bool operator==(const SavedDataPlan& o) const {
    return batch_sizes == o.batch_sizes && update_freqs == o.update_freqs;
  }
};

/// Everything a training run needs to continue exactly where it stopped. See Note [Checkpoint file].
struct Checkpoint {
  static constexpr int64_t kFormatVersion = 1;

  /// Parameters, then buffers, by module path (`conv1.weight`), on the CPU.
  std::vector<std::pair<std::string, torch::Tensor>> model;

  std::string optimizer_name;                                          // --optimizer
  std::map<std::string, double> optimizer_options;                     // its hyper-parameters (betas, eps, ...)
  std::optional<std::map<std::string, torch::Tensor>> optimizer_state;  // absent with --no-save-optimizer-state
  std::map<std::string, double> loss_scaler;                           // --fp16's DynamicLossScaler (else empty)
  std::string lr_scheduler_name;                                       // --lr-scheduler
  std::map<std::string, double> lr_scheduler_state;

  int64_t num_updates = 0;
  int64_t epoch = 1;   // the epoch of the next update
  int64_t offset = 0;  // samples of that epoch's permutation already consumed
  std::map<std::string, double> meters;  // see Controller::meter_state()
  torch::Tensor rng_state;               // the CPU generator's state
  std::optional<double> best;            // best --best-checkpoint-metric so far
  SavedDataPlan data_plan;

  std::string task;               // --task
  std::string model_digest;       // parameter names and shapes (hetseq/distributed/handshake.h)
  std::string options;            // the options that must match (TrainOptions::must_match)
  std::string torch_version;      // of the LibTorch that wrote the file
  int64_t format_version = kFormatVersion;
};

/// A copy of `t` on the CPU, detached (one copy, also for CPU tensors): what checkpoints keep of live
/// tensors that the next update changes.
torch::Tensor cpu_copy(const torch::Tensor& t);

/// The parameters and buffers of `model` as a checkpoint stores them (CPU copies).
std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model);

/// Copies `tensors` (from model_tensors) into `model`'s parameters and buffers. Throws
/// hetseq::InputError naming `source` (the file) on a missing or extra name or a shape mismatch.
void load_model_tensors(torch::nn::Module& model, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::string& source);

/// The file's bytes: a torch.save-compatible archive (readable with torch.load in Python) whose
/// `checksum` entry covers every other entry. See Note [Checkpoint file].
std::vector<char> encode_checkpoint(const Checkpoint& checkpoint);

/// Parses and verifies bytes written by encode_checkpoint. Throws hetseq::InputError naming `source`
/// when the bytes are truncated, altered (checksum), of another format version, or incomplete.
Checkpoint decode_checkpoint(const std::vector<char>& bytes, const std::string& source);

/// A digest of the training state (model, optimizer, LR scheduler, update count and position; not the
/// meters or RNG), as readable text: ranks that resumed compare it (see check_ranks_agree).
std::string state_digest(const Checkpoint& checkpoint);

/// Encodes `checkpoint` once and writes it to each of `paths` atomically (see write_file_atomically).
void save_checkpoint(const Checkpoint& checkpoint, const std::vector<std::filesystem::path>& paths);

/// Reads and verifies a checkpoint file. Throws hetseq::InputError naming the file.
Checkpoint load_checkpoint(const std::filesystem::path& path);

/// Loads only the model weights of a checkpoint file into `model` (hetseq-eval, tests).
void load_model(torch::nn::Module& model, const std::filesystem::path& path);

}  // namespace hetseq
