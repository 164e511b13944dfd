#include "hetseq/shard/parameter_sharding.h"

#include "hetseq/checkpoint/training_state.h"
#include "hetseq/core/error.h"
#include "hetseq/world/lost_peer.h"

namespace hetseq {

ParameterSharding::ParameterSharding(std::unique_ptr<ShardedOptimizer> optimizer,
                                     std::shared_ptr<ShardReducer> reducer, std::shared_ptr<UnitGather> units,
                                     c10::intrusive_ptr<c10d::ProcessGroup> group,
                                     c10::intrusive_ptr<c10d::ProcessGroup> host_group)
    : GradientSharding(std::move(optimizer), std::move(reducer), std::move(group)),
      units_(std::move(units)),
      host_group_(std::move(host_group)) {
  HETSEQ_ASSERT(units_, "ParameterSharding without its UnitGather");
  optimizer_->use_parameter_shard(units_->shard());
  UnitGather* held = units_.get();
  optimizer_->count_parameters_with([held] { return held->held_bytes(); });
}

void ParameterSharding::reduce() {
  reducer_->finish_update();
  units_->release_all();
}

void ParameterSharding::gather() {
  units_->gather_root();
  optimizer_->report_once();
}

int64_t ParameterSharding::passes(int64_t mine) {
  // In host memory where a group takes it (a host group, or the group of shards on the CPU): the host then
  // waits for its peers, never for its device (Note [Stat sync]).
  const bool on_host = host_group_ || units_->shard().device().is_cpu();
  const c10::intrusive_ptr<c10d::ProcessGroup>& group = host_group_ ? host_group_ : group_;
  std::vector<torch::Tensor> most{torch::full(
      {1}, mine, torch::TensorOptions().dtype(torch::kInt64).device(on_host ? torch::kCPU : units_->shard().device()))};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  wait_for_peers(group->allreduce(most, options), group->getRank(), group->getSize(),
                 "allreduce of the update's micro-batch counts");
  return on_host ? *most[0].const_data_ptr<int64_t>() : most[0].cpu().item<int64_t>();
}

void ParameterSharding::collect_model(bool keep) { collected_ = units_->whole_parameters(keep); }

void ParameterSharding::collect_model_digests() { collected_ = units_->parameter_digests(); }

std::vector<std::pair<std::string, torch::Tensor>> ParameterSharding::model_tensors(const torch::nn::Module& model) {
  const auto named = model.named_parameters(/*recurse=*/true);
  HETSEQ_ASSERT(collected_.size() == named.size(),
                "--zero-sharding full: the model's tensors asked for without collect_model ({} of {} parameters)",
                collected_.size(), named.size());
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t p = 0; p < named.size(); ++p) out.emplace_back(named[p].key(), collected_[p]);
  for (const auto& item : model.named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), cpu_copy(item.value()));
  collected_.clear();
  return out;
}

}  // namespace hetseq
