#include "hetseq/shard/shard_report.h"

#include <cstdio>

#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {

void print_shard_reports(const std::vector<ShardReport>& ranks, bool json) {
  for (const ShardReport& r : ranks) {
    log::info("[zero] rank {}: elements [{}, {}) ({}), parameters {:.1f} MB, gradients {:.1f} MB, optimizer state "
              "{:.1f} MB, budget {:.2f} GB",
              r.rank, r.first, r.first + r.numel, r.numel, r.param_bytes / 1e6, r.grad_bytes / 1e6, r.state_bytes / 1e6,
              static_cast<double>(r.budget_bytes) / (1 << 30));
    if (json) {
      fmt::print("{{\"tag\":\"shard\",\"rank\":{},\"first\":{},\"numel\":{},\"param_bytes\":{},\"grad_bytes\":{},"
                 "\"state_bytes\":{},\"budget_bytes\":{}}}\n",
                 r.rank, r.first, r.numel, r.param_bytes, r.grad_bytes, r.state_bytes, r.budget_bytes);
    }
  }
  std::fflush(stdout);
}

}  // namespace hetseq
