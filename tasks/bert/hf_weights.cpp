#include "tasks/bert/hf_weights.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "tasks/bert/bert_model.h"

namespace hetseq::bert {
namespace {

namespace fs = std::filesystem;

std::vector<char> read_bytes(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{} {}: cannot read the file", what, path));
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

torch::ScalarType safetensors_dtype(const std::string& name, const std::string& path, const std::string& tensor) {
  static const std::map<std::string, torch::ScalarType> types{
      {"F64", torch::kFloat64}, {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
      {"I64", torch::kInt64},   {"I32", torch::kInt32},   {"I16", torch::kInt16},   {"I8", torch::kInt8},
      {"U8", torch::kUInt8},    {"BOOL", torch::kBool}};
  const auto it = types.find(name);
  if (it == types.end()) {
    throw InputError(fmt::format("--init-from {}: tensor '{}' has dtype {}, which hetseq does not read", path, tensor,
                                 name));
  }
  return it->second;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  const std::vector<char> bytes = read_bytes(path, "--init-from");
  auto corrupt = [&](const std::string& why) {
    return InputError(fmt::format("--init-from {}: not a valid safetensors file ({})", path, why));
  };
  if (bytes.size() < 8) throw corrupt("shorter than its 8-byte header size");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  if (header_size > bytes.size() - 8) throw corrupt(fmt::format("header of {} bytes in a file of {}", header_size, bytes.size()));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_size));
  } catch (const nlohmann::json::exception& e) {
    throw corrupt(std::string("header: ") + e.what());
  }
  const uint64_t data_begin = 8 + header_size;
  const uint64_t data_size = bytes.size() - data_begin;
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") continue;
    try {
      const auto& entry = item.value();
      const torch::ScalarType dtype = safetensors_dtype(entry.at("dtype").get<std::string>(), path, item.key());
      const std::vector<int64_t> shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size) {
        throw corrupt(fmt::format("tensor '{}' lies outside the data", item.key()));
      }
      torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(dtype));
      const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
      if (nbytes != offsets[1] - offsets[0]) {
        throw corrupt(fmt::format("tensor '{}' of shape [{}] needs {} bytes, the file gives {}", item.key(),
                                  fmt::join(shape, ", "), nbytes, offsets[1] - offsets[0]));
      }
      if (nbytes > 0) std::memcpy(t.data_ptr(), bytes.data() + data_begin + offsets[0], nbytes);
      tensors.emplace(item.key(), std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw corrupt(fmt::format("entry '{}': {}", item.key(), e.what()));
    }
  }
  return tensors;
}

std::map<std::string, torch::Tensor> read_pytorch_bin(const std::string& path) {
  const std::vector<char> bytes = read_bytes(path, "--init-from");
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw InputError(fmt::format("--init-from {}: not a state dict saved by torch.save ({})", path,
                                 std::string(e.what()).substr(0, 200)));
  }
  if (!value.isGenericDict()) throw InputError(fmt::format("--init-from {}: holds no dictionary of tensors", path));
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& entry : value.toGenericDict()) {
    if (entry.key().isString() && entry.value().isTensor()) {
      tensors.emplace(entry.key().toStringRef(), entry.value().toTensor());
    }
  }
  return tensors;
}

std::string find_weights_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* name : {"model.safetensors", "pytorch_model.bin"}) {
      const fs::path candidate = fs::path(path) / name;
      if (fs::exists(candidate, ec)) return candidate.string();
    }
    throw InputError(fmt::format("--init-from {}: the directory has neither model.safetensors nor pytorch_model.bin",
                                 path));
  }
  if (!fs::exists(path, ec)) {
    throw InputError(fmt::format("--init-from {}: no such file or directory; give a Hugging Face model directory or "
                                 "its model.safetensors / pytorch_model.bin",
                                 path));
  }
  return path;
}

// Note [Hugging Face names]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Our parameters carry the names of Google's BERT as ported to PyTorch, which Hugging Face and HetSeq keep. A
// checkpoint's name maps to ours by these rules, in order:
//  * `*.gamma` / `*.beta` (LayerNorm in checkpoints converted from TensorFlow) are `*.weight` / `*.bias`;
//  * `*.position_ids` (a buffer) and `cls.predictions.decoder.weight` (the tied word embeddings, stored twice) are
//    skipped; `cls.predictions.decoder.bias` is `cls.predictions.bias`;
//  * an encoder-only checkpoint (a BertModel: `embeddings.*`, `encoder.*`, `pooler.*`) loads into
//    BertForPreTraining under `bert.`, and a pretraining checkpoint (`bert.*`) loads into a bare BertModel without
//    that prefix (its `cls.*` heads are then unexpected);
//  * `*.attention.self.{query,key,value}.{weight,bias}` are rows of our fused `*.attention.self.qkv.*` (Note
//    [One QKV product]); the fused parameter counts as loaded when all three of its parts were.
// Anything else that matches no parameter is reported as unexpected and ignored (e.g. a fine-tuning head).

LoadReport load_hf_weights(torch::nn::Module& model, const std::string& weights_file) {
  LoadReport report;
  report.file = weights_file;
  std::map<std::string, torch::Tensor> tensors =
      ends_with(weights_file, ".safetensors") ? read_safetensors(weights_file) : read_pytorch_bin(weights_file);
  auto params = model.named_parameters(/*recurse=*/true);
  const bool has_bert_prefix = params.contains("bert.embeddings.word_embeddings.weight");

  std::set<std::string> assigned;
  std::map<std::string, int> fused_parts;  // [fused parameter] its parts (query, key, value) loaded
  torch::NoGradGuard no_grad;
  for (auto& [file_name, tensor] : tensors) {
    std::string name = file_name;
    if (ends_with(name, ".gamma")) name = name.substr(0, name.size() - 6) + ".weight";
    if (ends_with(name, ".beta")) name = name.substr(0, name.size() - 5) + ".bias";
    if (ends_with(name, "position_ids") || name == "cls.predictions.decoder.weight") continue;
    if (name == "cls.predictions.decoder.bias") {
      if (tensors.count("cls.predictions.bias")) continue;
      name = "cls.predictions.bias";
    }
    if (has_bert_prefix && !starts_with(name, "bert.") && !starts_with(name, "cls.")) name = "bert." + name;
    if (!has_bert_prefix && starts_with(name, "bert.")) name = name.substr(5);
    torch::Tensor* param = params.find(name);
    torch::Tensor part;  // the rows of a fused parameter that `name` is
    if (param == nullptr) {
      if (const std::optional<FusedSlice> slice = fused_slice(name)) {
        if (torch::Tensor* fused = params.find(slice->parameter)) {
          const int64_t rows = fused->size(0) / 3;
          part = fused->narrow(0, slice->part * rows, rows);
          param = &part;
          ++fused_parts[slice->parameter];
        }
      }
    }
    if (param == nullptr) {
      report.unexpected.push_back(file_name);
      continue;
    }
    if (param->sizes() != tensor.sizes()) {
      throw InputError(fmt::format("--init-from {}: tensor '{}' has shape [{}], but the model's '{}' has shape [{}]; "
                                   "does --config_file describe this checkpoint?",
                                   weights_file, file_name, fmt::join(tensor.sizes(), ", "), name,
                                   fmt::join(param->sizes(), ", ")));
    }
    param->copy_(tensor.to(param->dtype()));
    assigned.insert(name);
    if (!part.defined()) report.loaded.push_back(name);  // a fused parameter counts once, below
  }
  // A fused parameter is loaded when each of its parts is.
  for (const auto& [fused, parts] : fused_parts) {
    if (parts < 3) continue;
    assigned.insert(fused);
    report.loaded.push_back(fused);
  }
  bool any_encoder = false;
  for (const auto& p : params) {
    if (assigned.count(p.key()) == 0) {
      report.missing.push_back(p.key());
    } else if (!starts_with(p.key(), "cls.")) {
      any_encoder = true;
    }
  }
  if (!any_encoder) {
    throw InputError(fmt::format("--init-from {}: none of its {} tensors is a BERT encoder weight (e.g. "
                                 "'bert.embeddings.word_embeddings.weight' or 'embeddings.word_embeddings.weight'); "
                                 "is it a BERT checkpoint in Hugging Face's layout?",
                                 weights_file, tensors.size()));
  }
  return report;
}

}  // namespace hetseq::bert
