#include "tensors_module.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq::python {

// Note [Python parameters in a C++ module]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// hetseq's C++ parts take a torch::nn::Module. A Python module is not one, but its parameters and buffers
// are at::Tensors: registered in a C++ module of their own, they are the same tensors (one TensorImpl), so
// the c10d::Reducer's gradient hooks sit on the Python parameters' gradient accumulators and fire in the
// Python backward pass, the broadcast from rank 0 writes into them, and a checkpoint's load copies into them.
// They are registered under Python's dotted paths, each component a submodule, in the order Python lists
// them. Python's named_parameters() walks the modules in pre-order, each module's own parameters before
// its children's, and so does LibTorch's; so the C++ order is Python's (the reducer's buckets follow it),
// and the names and the digest (model_digest) are those of a C++ model of the same structure, which is
// what lets hetseq-eval load a checkpoint written from Python into a registered task's model.

TensorsModule::TensorsModule(const NamedTensors& parameters, const NamedTensors& buffers) {
  for (const auto& [path, t] : parameters) {
    auto [module, name] = owner(path);
    module->register_parameter(name, t, t.requires_grad());
  }
  for (const auto& [path, t] : buffers) {
    auto [module, name] = owner(path);
    module->register_buffer(name, t);
  }
}

std::pair<torch::nn::Module*, std::string> TensorsModule::owner(const std::string& path) {
  torch::nn::Module* module = this;
  size_t begin = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', begin)) {
    if (dot == begin) throw UsageError(fmt::format("the tensor name '{}' has an empty component", path));
    const std::string prefix = path.substr(0, dot);
    auto it = submodules_.find(prefix);
    if (it == submodules_.end()) {
      auto child = std::make_shared<torch::nn::Module>(prefix);
      module->register_module(path.substr(begin, dot - begin), child);
      it = submodules_.emplace(prefix, std::move(child)).first;
    }
    module = it->second.get();
    begin = dot + 1;
  }
  if (begin == path.size()) throw UsageError(fmt::format("the tensor name '{}' has an empty component", path));
  return {module, path.substr(begin)};
}

}  // namespace hetseq::python
