#pragma once
/// The shard plan as a run prints it at start: one line per rank on rank 0.

#include <cstdint>
#include <vector>

namespace hetseq {

/// One rank's line of the shard plan, as printed at start (`shard` records).
struct ShardReport {
  int64_t rank = 0;
  int64_t first = 0;        // first element of the flat parameter space in its shard
  int64_t numel = 0;        // elements in its shard
  int64_t state_bytes = 0;  // bytes of optimizer state it holds, read from the tensors allocated
  int64_t budget_bytes = 0;
  int64_t param_bytes = 0;  // bytes of parameters it holds (the whole model under none and os)
  int64_t grad_bytes = 0;   // bytes of gradients it holds after the reduction (the whole model under none and os)
};

/// Logs every rank's line ([rank]) with the `[zero]` prefix and, when `json`, prints each as a JSON line
/// on stdout: {"tag":"shard","rank":R,"first":F,"numel":N,"param_bytes":P,"grad_bytes":G,"state_bytes":S,
/// "budget_bytes":B}: what the rank holds of the parameters, the gradients and the optimizer state, each
/// read from the tensors allocated, against its budget. Rank 0's
/// sharding strategy calls it once, after the first update (when the state exists).
void print_shard_reports(const std::vector<ShardReport>& ranks, bool json);

}  // namespace hetseq
