// What a rank's memory holds at start: the micro-batch cap found by probing (--auto-balance on CUDA) and
// the memory check before training (Note [Memory that a rank needs], hetseq/shard/memory_fit.cpp).
#include <algorithm>

#include <c10/cuda/CUDACachingAllocator.h>

#include "hetseq/balance/allocation_peak.h"
#include "hetseq/balance/free_memory.h"
#include "hetseq/balance/memory_probe.h"
#include "hetseq/core/logging.h"
#include "hetseq/session/train_session.h"
#include "hetseq/shard/sharded_optimizer.h"
#include "hetseq/shard/unit_gather.h"
#include "hetseq/task/buffer_snapshot.h"
#include "hetseq/train/precision.h"

namespace hetseq {

// --auto-balance on a CUDA device without --balance-cap: the cap is found by running one forward and
// backward at growing sizes until the device runs out of memory (probe_micro_batch_cap). The model's
// buffers (running statistics) are put back afterwards; its parameters are untouched (no step).
int64_t TrainSession::probe_cap(int64_t batch_size) {
  if (!o_.balance.auto_balance || !world_.device().is_cuda() || !world_.distributed()) return 0;
  BufferSnapshot buffers(*model_);
  auto try_size = [&](int64_t b) {
    std::vector<int64_t> indices(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) indices[static_cast<size_t>(i)] = i % train_data_->size();
    const Batch batch = train_data_->collate(indices).to(world_.device());
    const AutocastGuard autocast(world_.device(), o_.mixed_precision.precision);
    task_->train_step(*model_, batch, [](const StepOutput& step) { step.loss.backward(); });
  };
  auto release = [&] {
    model_->zero_grad(/*set_to_none=*/true);
    c10::cuda::CUDACachingAllocator::emptyCache();
  };
  ProbeOptions probe;
  probe.start = batch_size;
  const int64_t most_freq =
      *std::max_element(o_.optimization.update_freq.begin(), o_.optimization.update_freq.end());
  probe.limit = batch_size * most_freq * world_.world_size();
  const int64_t cap = probe_micro_batch_cap(try_size, release, probe);
  buffers.restore();
  log::info("[balance] rank {}: micro-batch cap {} from probing {} (--balance-cap sets it)", world_.rank(),
            cap > 0 ? std::to_string(cap) : "none needed", world_.device().str());
  return cap;
}

// The memory check's figures for this rank (Note [Memory that a rank needs]), when it states a budget
// (--memory-budget, or the free memory under --zero-sharding os): the budget, read before anything below
// allocates, and the peak bytes of one forward and backward of its micro-batch with the gradients
// allocated, run before the reducer hooks the model. The model's buffers are put back afterwards, its
// parameters are untouched, and the update's randomness is reseeded per update (Controller).
RankMemoryBudget TrainSession::measure_memory(int64_t batch_size) {
  const DistributedOptions& d = o_.distributed;
  RankMemoryBudget m;
  if (!d.memory_budget_bytes && !sharding_.steps_shards()) return m;
  m.from_free_memory = !d.memory_budget_bytes;
  m.budget_bytes = d.memory_budget_bytes ? *d.memory_budget_bytes : free_memory_bytes(world_.device());
  m.micro_batch = o_.balance.caps.empty() || o_.balance.caps[0] <= 0 ? batch_size
                                                                      : std::min(batch_size, o_.balance.caps[0]);
  BufferSnapshot buffers(*model_);
  for (auto& p : model_->parameters()) {
    if (p.requires_grad()) p.mutable_grad() = torch::zeros_like(p);
  }
  std::vector<int64_t> indices(static_cast<size_t>(m.micro_batch));
  for (int64_t i = 0; i < m.micro_batch; ++i) indices[static_cast<size_t>(i)] = i % train_data_->size();
  const Batch batch = train_data_->collate(indices).to(world_.device());
  m.activation_bytes = peak_allocated_bytes([&] {
    const AutocastGuard autocast(world_.device(), o_.mixed_precision.precision);
    task_->train_step(*model_, batch, [](const StepOutput& step) { step.loss.backward(); });
  });
  model_->zero_grad(/*set_to_none=*/true);
  if (world_.device().is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
  buffers.restore();
  return m;
}

// Every rank checks every rank's figures from the handshake, so a plan that does not fit stops all ranks
// alike with the same line, before any collective or checkpoint (Note [Memory that a rank needs]).
void TrainSession::check_memory() {
  if (std::none_of(memory_.begin(), memory_.end(), [](const RankMemoryBudget& m) { return m.budget_bytes > 0; })) {
    return;
  }
  MemoryFitOptions m;
  m.sharding = sharding_.counted_in_memory();
  m.num_params = num_params_;
  m.element_bytes = static_cast<int64_t>(model_->parameters().front().element_size());
  const auto optimizer = o_.optimization.make_optimizer(model_->parameters());  // asked, never stepped
  m.state_buffers = optimizer->state_buffers();
  m.optimizer = optimizer->name();
  m.alignment = ShardedOptimizerOptions{}.alignment;
  m.gather = ShardedOptimizerOptions{}.gather;
  m.bucket_bytes = static_cast<int64_t>(o_.distributed.ddp.bucket_cap_mb * (1 << 20));
  m.ranks = memory_;
  if (sharding_.gathers_parameters()) {
    const UnitSizes sizes = unit_sizes(model_->parameters(), parameter_units(*model_));
    m.root_numel = sizes.root;
    m.largest_unit_numel = sizes.largest;
    m.rank0_copies_model = !o_.checkpoint.save.no_save && world_.device().is_cpu();
  }
  const std::vector<MemoryNeed> needs = memory_needs(m);
  if (world_.rank() == 0) {
    for (size_t r = 0; r < needs.size(); ++r) {
      if (memory_[r].budget_bytes == 0) continue;
      const MemoryNeed& n = needs[r];
      log::info("[memory] rank {}: needs {:.1f} MB of its {:.1f} MB (parameters {:.1f}, gradients {:.1f}, optimizer "
                "state {:.1f}, gather buffers {:.1f}, activations {:.1f} for {} samples)",
                r, n.total() / 1e6, memory_[r].budget_bytes / 1e6, n.parameters / 1e6, n.gradients / 1e6,
                n.optimizer_state / 1e6, n.gather_buffers / 1e6, n.activations / 1e6, memory_[r].micro_batch);
    }
  }
  check_memory_fits(m);
}

}  // namespace hetseq
