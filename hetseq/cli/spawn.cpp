#include "hetseq/cli/spawn.h"

#include <algorithm>
#include <thread>

#include <torch/cuda.h>

#include "hetseq/core/error.h"
#include "hetseq/distributed/launcher.h"
#include "hetseq/distributed/rendezvous.h"

namespace hetseq::cli {

int64_t local_workers(const TrainOptions& o) {
  if (o.distributed.gpus) return *o.distributed.gpus;
  if (!o.common.cpu && torch::cuda::is_available()) return static_cast<int64_t>(torch::cuda::device_count());
  return 1;
}

namespace {

// A per-worker flag's values: one for all workers, or one each. Throws hetseq::UsageError naming `flag`.
std::vector<int64_t> per_worker(const char* flag, const std::vector<int64_t>& values, int64_t workers) {
  if (values.size() == 1) return std::vector<int64_t>(static_cast<size_t>(workers), values[0]);
  if (static_cast<int64_t>(values.size()) == workers) return values;
  throw UsageError(fmt::format("{}: {} values for the {} workers of this node (--distributed-gpus); give one value, "
                               "or one per worker",
                               flag, values.size(), workers));
}

}  // namespace

int spawn_workers(const TrainOptions& o, int argc, const char* const argv[], int64_t workers) {
  const WorldOptions& d = o.distributed.world;
  LaunchOptions launch;
  launch.argv = resolve_aliases(argc, argv);
  launch.num_workers = workers;
  launch.first_rank = d.rank;
  // HetSeq's default: the world is this node's workers.
  launch.world_size = d.world_size.value_or(d.rank + workers);
  launch.batch_sizes = per_worker("--max-sentences", o.dataset.max_sentences, workers);
  if (!o.balance.caps.empty()) launch.balance_caps = per_worker("--balance-cap", o.balance.caps, workers);
  const bool on_cpu = o.common.cpu || !torch::cuda::is_available();
  const int64_t cores = static_cast<int64_t>(std::thread::hardware_concurrency());
  launch.intra_op_threads = o.common.intra_op_threads > 0 ? o.common.intra_op_threads
                                                          : (on_cpu ? std::max<int64_t>(1, cores / workers) : 0);
  std::string init_method = d.init_method;
  if (init_method.empty() && launch.world_size == workers) {
    init_method = "tcp://127.0.0.1:0";  // a single node: a private rendezvous on loopback
  } else if (init_method.empty()) {
    throw UsageError("--distributed-init-method is needed when the world spans several nodes "
                     "(--distributed-world-size larger than this node's workers): tcp://HOST:PORT, "
                     "file:///shared/path or env://");
  }
  if (init_method.rfind("tcp://", 0) == 0 && d.rank == 0) {
    const InitMethod m = parse_init_method(init_method, {});
    launch.host_tcp_store = true;
    launch.store_host = m.host;
    launch.store_port = m.port;
  }
  launch.init_method = init_method;
  launch.store_timeout = d.timeout;
  return launch_workers(launch);
}

}  // namespace hetseq::cli
