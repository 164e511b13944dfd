#include "hetseq/shard/accumulator_hooks.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "hetseq/core/error.h"

namespace hetseq {

AccumulatorHooks::~AccumulatorHooks() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(keys_[k]);
}

void AccumulatorHooks::add(const torch::Tensor& param, std::function<void()> on_accumulated,
                           const std::string& what) {
  std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(param);
  HETSEQ_ASSERT(acc, "{} has no gradient accumulator (does it require a gradient?)", what);
  keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [on_accumulated = std::move(on_accumulated)](const torch::autograd::variable_list& outputs,
                                                   const torch::autograd::variable_list&) {
        on_accumulated();
        return outputs;
      })));
  accumulators_.push_back(std::move(acc));
}

}  // namespace hetseq
