#include "hetseq/shard/no_sharding.h"

#include "hetseq/core/error.h"

namespace hetseq {

NoSharding::NoSharding(std::unique_ptr<optim::Optimizer> optimizer, std::shared_ptr<GradientReducer> reducer)
    : optimizer_(std::move(optimizer)), reducer_(std::move(reducer)) {
  HETSEQ_ASSERT(optimizer_ && reducer_, "NoSharding built with a null part");
}

void NoSharding::load_state(const std::map<std::string, torch::Tensor>& scalars, const optim::StateSource& pieces) {
  const auto& params = optimizer_->params();
  std::vector<int64_t> numels;  // [param]
  int64_t total = 0;
  for (const auto& p : params) {
    numels.push_back(p.numel());
    total += p.numel();
  }
  std::map<std::string, torch::Tensor> state = scalars;
  for (auto& [key, t] : pieces.read_range(0, total, numels).state) {
    // "param.{i}.{name}": buffers take their parameter's shape back; steps stay scalars.
    const size_t dot = key.find('.', 6);
    const size_t i = static_cast<size_t>(std::stoll(key.substr(6, dot - 6)));
    const bool step = key.compare(dot + 1, std::string::npos, "step") == 0;
    state[key] = step || i >= params.size() || t.numel() != params[i].numel() ? t : t.view(params[i].sizes());
  }
  optimizer_->load_state(state);
}

}  // namespace hetseq
