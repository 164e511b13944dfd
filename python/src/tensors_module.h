#pragma once
// A Python module's parameters and buffers as a C++ torch::nn::Module: what hetseq's C++ parts (the reducer,
// the checkpoint's model entries and digest) take. See Note [Python parameters in a C++ module].

#include <torch/nn/module.h>
#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hetseq::python {

/// Named tensors as Python's `named_parameters()` / `named_buffers()` give them (dotted module paths).
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// The same tensors (one TensorImpl each) registered under the same dotted paths: `fc1.weight` is the
/// parameter `weight` of a child module `fc1`, so that named_parameters() here lists what Python lists, in
/// its order, and a checkpoint's names are those of an equal C++ model (a registered task's).
class TensorsModule final : public torch::nn::Module {
 public:
  TensorsModule(const NamedTensors& parameters, const NamedTensors& buffers);

 private:
  /// The module that holds the last component of `path`, made with the submodules on the way; and that
  /// component.
  std::pair<torch::nn::Module*, std::string> owner(const std::string& path);

  std::map<std::string, std::shared_ptr<torch::nn::Module>> submodules_;  // [dotted path] made by owner()
};

}  // namespace hetseq::python
