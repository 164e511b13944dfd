// One rank of the shard-gather benchmark for --zero-sharding os: times ShardGather::gather() (the
// updated shards to every rank) with each method of Note [Gathering uneven shards], over Gloo.
//
//   zero-gather --world-size W --rank R --store-file PATH [--model mnist | --numel N] [--budgets 1,1,2]
//               [--iters K] [--method allgather_padded|broadcast_per_rank]
//
// Start W processes with the same store file. Ranks meet at a barrier before each timed gather. Rank 0
// prints one JSON line per method with the median time over K gathers and the bytes each rank
// receives (sum of the other ranks' shards: what an exact gather must move).
#include <algorithm>
#include <chrono>
#include <iostream>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/parse.h"
#include "hetseq/world/process_group.h"
#include "hetseq/shard/shard_gather.h"
#include "hetseq/shard/shard_plan.h"
#include "tasks/mnist/mnist_model.h"

namespace {

int run(int argc, char** argv) {
  int64_t world = 0, rank = -1, numel = 0, iters = 30;
  std::string store_file, model_name = "synthetic", budgets_text = "1,1,2", only;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw hetseq::UsageError(fmt::format("{} needs a value", flag));
    const std::string value = argv[i + 1];
    if (flag == "--world-size") world = hetseq::parse_int(flag, value);
    else if (flag == "--rank") rank = hetseq::parse_int(flag, value);
    else if (flag == "--store-file") store_file = value;
    else if (flag == "--model") model_name = value;
    else if (flag == "--numel") numel = hetseq::parse_int(flag, value);
    else if (flag == "--budgets") budgets_text = value;
    else if (flag == "--iters") iters = hetseq::parse_int(flag, value);
    else if (flag == "--method") only = value;
    else throw hetseq::UsageError(fmt::format("unknown flag {}", flag));
  }
  const std::vector<int64_t> budgets = hetseq::parse_int_list("--budgets", budgets_text);
  if (world < 2 || rank < 0 || rank >= world || store_file.empty() || iters < 1 ||
      static_cast<int64_t>(budgets.size()) != world) {
    throw hetseq::UsageError(
        "need --world-size W >= 2, --rank in [0, W), --store-file PATH, --iters >= 1, and W budgets");
  }
  torch::set_num_threads(1);
  std::vector<torch::Tensor> params;
  if (model_name == "mnist") {
    hetseq::mnist::MnistNet net;
    for (const auto& p : net->parameters()) params.push_back(p.detach());
  } else if (numel > 0) {
    for (int k = 0; k < 16; ++k) params.push_back(torch::randn({numel / 16 + (k < numel % 16 ? 1 : 0)}));
  } else {
    throw hetseq::UsageError("--model mnist, or --numel N > 0");
  }
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  const auto plan = hetseq::plan_shards(budgets, total);

  auto store = c10::make_intrusive<c10d::FileStore>(store_file, static_cast<int>(world));
  auto group = hetseq::make_process_group(store, rank, world, hetseq::ProcessGroupOptions{});
  using Clock = std::chrono::steady_clock;
  for (const auto method : {hetseq::GatherMethod::kAllgatherPadded, hetseq::GatherMethod::kBroadcastPerRank}) {
    const std::string name =
        method == hetseq::GatherMethod::kAllgatherPadded ? "allgather_padded" : "broadcast_per_rank";
    if (!only.empty() && only != name) continue;
    hetseq::ShardGather gather(group, plan, params, method);
    std::vector<double> times;
    for (int64_t k = 0; k < iters + 3; ++k) {
      group->barrier()->wait();
      const auto start = Clock::now();
      gather.gather();
      const double s = std::chrono::duration<double>(Clock::now() - start).count();
      if (k >= 3) times.push_back(s);
    }
    std::sort(times.begin(), times.end());
    if (rank == 0) {
      const int64_t received = (total - plan[0].numel) * 4;
      std::cout << fmt::format(
                       "{{\"method\":\"{}\",\"world\":{},\"numel\":{},\"budgets\":\"{}\",\"median_ms\":{:.3f},"
                       "\"rank0_received_MB\":{:.2f}}}",
                       name, world, total, budgets_text, 1e3 * times[times.size() / 2], received / 1e6)
                << std::endl;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const hetseq::UsageError& e) {
    std::cerr << "zero-gather: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "zero-gather: error: " << e.what() << std::endl;
    return 1;
  }
}
