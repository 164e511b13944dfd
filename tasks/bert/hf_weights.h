#pragma once
/// Pretrained BERT weights in Hugging Face's layout (`model.safetensors` or `pytorch_model.bin`), loaded into our
/// BertModel or BertForPreTraining (`--init-from`).

#include <map>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace hetseq::bert {

/// The tensors of a safetensors file by name, as float32/int64/... CPU tensors (their own memory). Throws
/// hetseq::InputError naming the file for a missing file, a bad header, an unknown dtype or offsets outside it.
std::map<std::string, torch::Tensor> read_safetensors(const std::string& path);

/// The tensors of a `pytorch_model.bin` (a state dict saved by torch.save, zip format). Throws hetseq::InputError
/// naming the file when it is not one.
std::map<std::string, torch::Tensor> read_pytorch_bin(const std::string& path);

/// The weights file of `path`: the file itself, or in a directory `model.safetensors`, else `pytorch_model.bin`.
/// Throws hetseq::InputError naming --init-from when there is none.
std::string find_weights_file(const std::string& path);

/// What load_hf_weights did.
struct LoadReport {
  std::string file;
  std::vector<std::string> loaded;      // our parameter names that got a tensor (a fused QKV one: all three parts)
  std::vector<std::string> missing;     // our parameters the file has no tensor for (kept as initialised)
  std::vector<std::string> unexpected;  // file tensors that match nothing of ours (ignored)
};

/// Copies the tensors of `weights_file` into `model`'s parameters by name (see Note [Hugging Face names]), cast to
/// each parameter's dtype. Throws hetseq::InputError naming the file and the tensor when shapes differ, and when no
/// encoder parameter (under `bert.`, or at the top for a bare BertModel) matches at all (the wrong file). Missing
/// heads (an encoder-only checkpoint) are reported, not an error.
LoadReport load_hf_weights(torch::nn::Module& model, const std::string& weights_file);

}  // namespace hetseq::bert
