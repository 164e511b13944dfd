#include "hetseq/data/batch.h"

#include "hetseq/core/error.h"

namespace hetseq {

const torch::Tensor& Batch::at(const std::string& name) const {
  auto it = fields.find(name);
  HETSEQ_ASSERT(it != fields.end(), "batch has no field '{}'", name);
  return it->second;
}

Batch Batch::to(const torch::Device& device) const {
  Batch out;
  out.num_samples = num_samples;
  for (const auto& [name, tensor] : fields) {
    out.fields.emplace(name, tensor.to(device, /*non_blocking=*/tensor.is_pinned()));
  }
  return out;
}

}  // namespace hetseq
