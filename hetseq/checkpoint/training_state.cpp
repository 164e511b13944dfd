#include "hetseq/checkpoint/training_state.h"

#include <algorithm>

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

torch::Tensor cpu_copy(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), cpu_copy(item.value()));
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    out.emplace_back(item.key(), cpu_copy(item.value()));
  }
  return out;
}

void load_model_tensors(torch::nn::Module& model, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::string& source) {
  std::map<std::string, torch::Tensor> saved(tensors.begin(), tensors.end());
  std::vector<std::pair<std::string, torch::Tensor>> targets;
  for (auto& item : model.named_parameters(true)) targets.emplace_back(item.key(), item.value());
  for (auto& item : model.named_buffers(true)) targets.emplace_back(item.key(), item.value());
  // Check everything first, so that a mismatch leaves the model unchanged.
  for (const auto& [name, target] : targets) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      throw InputError(fmt::format("{}: has no tensor '{}'; was it saved from another model or task?", source, name));
    }
    if (it->second.sizes() != target.sizes()) {
      throw InputError(fmt::format("{}: tensor '{}' has shape [{}] but the model expects [{}]", source, name,
                                   fmt::join(it->second.sizes(), ", "), fmt::join(target.sizes(), ", ")));
    }
  }
  if (saved.size() != targets.size()) {
    for (const auto& entry : saved) {
      const std::string& name = entry.first;  // not a structured binding: lambdas capture those only from C++20
      const bool known = std::any_of(targets.begin(), targets.end(), [&](const auto& p) { return p.first == name; });
      if (!known) {
        throw InputError(fmt::format("{}: has a tensor '{}' that the model does not have; was it saved from another "
                                     "model or task?",
                                     source, name));
      }
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) target.copy_(saved.at(name));
}

// The generators are reached through ATen's context, whose CUDA hooks a LibTorch without CUDA also has
// (they fail there, so every call is behind the device count, 0 without CUDA).
std::vector<torch::Tensor> cuda_rng_states() {
  std::vector<torch::Tensor> out;
  const auto devices = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < devices; ++i) {
    auto gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(i)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.push_back(gen.get_state());
  }
  return out;
}

int64_t set_cuda_rng_states(const std::vector<torch::Tensor>& states, const std::string& source) {
  const auto devices = std::min(static_cast<int64_t>(torch::cuda::device_count()), static_cast<int64_t>(states.size()));
  for (int64_t i = 0; i < devices; ++i) {
    auto gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(i)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    try {
      gen.set_state(states[static_cast<size_t>(i)]);
    } catch (const c10::Error& e) {
      throw InputError(fmt::format("{}: the saved state of CUDA device {}'s generator ({} bytes) does not fit this "
                                   "LibTorch's generator: {}; resume with the LibTorch that wrote it",
                                   source, i, states[static_cast<size_t>(i)].numel(), e.what_without_backtrace()));
    }
  }
  return devices;
}

}  // namespace hetseq
