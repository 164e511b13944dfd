// One rank of the gradient-reduction benchmark for --zero-sharding os (issue "Memory-heterogeneous
// sharding", section "The update"): how the summed gradients reach each rank's shard, over Gloo.
//
//   zero-reduce --world-size W --rank R --store-file PATH [--numel N] [--budgets 1,1,2] [--iters K]
//               [--bucket-cap-mb 25]
//
// Methods, timed side by side (alternating within each repetition, after a barrier):
//   allreduce_slice:       allreduce (sum) of the flat gradient in buckets of --bucket-cap-mb, as the
//                          ordinary reducer does; the rank then reads its shard (a view, no copy).
//   reduce_scatter_padded: one _reduce_scatter_base over W x max_shard elements: ProcessGroupGloo's
//                          reduce-scatter takes equal sizes only, so every shard is padded with zeros
//                          to the largest one. The pack into the padded buffer is timed with it (it
//                          replaces the reducer's copy into its buckets).
// Each rank's gradient is the same seeded random vector per rank. Rank 0 prints one JSON line per method
// with the median time over K repetitions and the bytes each rank wrote to its sockets per update
// (wchar of /proc/self/io: Gloo's TCP pairs send with writev), and a line that compares the shard that
// reduce_scatter_padded gives with the slice of the allreduce, element by element over all ranks.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/parse.h"
#include "hetseq/world/process_group.h"
#include "hetseq/shard/shard_plan.h"

namespace {

/// Bytes this process has passed to write-like system calls (sockets included), from /proc/self/io.
int64_t written_bytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "wchar:") return value;
  }
  throw hetseq::InputError("zero-reduce: no wchar in /proc/self/io");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(int argc, char** argv) {
  int64_t world = 0, rank = -1, numel = 10000000, iters = 15;
  double bucket_cap_mb = 25;
  std::string store_file, budgets_text = "1,1,2";
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw hetseq::UsageError(fmt::format("{} needs a value", flag));
    const std::string value = argv[i + 1];
    if (flag == "--world-size") world = hetseq::parse_int(flag, value);
    else if (flag == "--rank") rank = hetseq::parse_int(flag, value);
    else if (flag == "--store-file") store_file = value;
    else if (flag == "--numel") numel = hetseq::parse_int(flag, value);
    else if (flag == "--budgets") budgets_text = value;
    else if (flag == "--iters") iters = hetseq::parse_int(flag, value);
    else if (flag == "--bucket-cap-mb") bucket_cap_mb = hetseq::parse_double(flag, value);
    else throw hetseq::UsageError(fmt::format("unknown flag {}", flag));
  }
  const std::vector<int64_t> budgets = hetseq::parse_int_list("--budgets", budgets_text);
  if (world < 2 || rank < 0 || rank >= world || store_file.empty() || iters < 1 || numel < world ||
      bucket_cap_mb <= 0 || static_cast<int64_t>(budgets.size()) != world) {
    throw hetseq::UsageError(
        "need --world-size W >= 2, --rank in [0, W), --store-file PATH, --iters >= 1, --numel >= W, "
        "--bucket-cap-mb > 0 and W budgets");
  }
  torch::set_num_threads(1);
  const auto plan = hetseq::plan_shards(budgets, numel);  // [rank]
  int64_t max_shard = 0;
  for (const auto& s : plan) max_shard = std::max(max_shard, s.numel);
  const int64_t bucket = std::max<int64_t>(1, static_cast<int64_t>(bucket_cap_mb * 1024 * 1024 / 4));

  torch::manual_seed(1234 + rank);
  const torch::Tensor grad = torch::randn({numel});  // this rank's gradient, never modified
  torch::Tensor flat = torch::empty({numel});        // the reducer's buckets, end to end
  torch::Tensor padded = torch::zeros({world * max_shard});  // [rank][max_shard], zero padded
  torch::Tensor out = torch::empty({max_shard});

  auto store = c10::make_intrusive<c10d::FileStore>(store_file, static_cast<int>(world));
  auto group = hetseq::make_process_group(store, rank, world, hetseq::ProcessGroupOptions{});
  using Clock = std::chrono::steady_clock;

  auto allreduce_slice = [&] {
    for (int64_t first = 0; first < numel; first += bucket) {
      std::vector<torch::Tensor> b{flat.narrow(0, first, std::min(bucket, numel - first))};
      group->allreduce(b)->wait();
    }
    return flat.narrow(0, plan[rank].first, plan[rank].numel);
  };
  auto reduce_scatter_padded = [&] {
    for (int64_t r = 0; r < world; ++r) {
      padded.narrow(0, r * max_shard, plan[r].numel).copy_(grad.narrow(0, plan[r].first, plan[r].numel));
    }
    group->_reduce_scatter_base(out, padded)->wait();
    return out.narrow(0, 0, plan[rank].numel);
  };

  std::vector<double> t_ar, t_rs;
  int64_t w_ar = 0, w_rs = 0;
  int64_t mismatched = 0;
  double max_abs = 0;
  for (int64_t k = 0; k < iters + 2; ++k) {
    flat.copy_(grad);
    group->barrier()->wait();
    int64_t w0 = written_bytes();
    auto start = Clock::now();
    const torch::Tensor a = allreduce_slice();
    const double ta = std::chrono::duration<double>(Clock::now() - start).count();
    const int64_t wa = written_bytes() - w0;

    group->barrier()->wait();
    w0 = written_bytes();
    start = Clock::now();
    const torch::Tensor b = reduce_scatter_padded();
    const double tb = std::chrono::duration<double>(Clock::now() - start).count();
    const int64_t wb = written_bytes() - w0;
    if (k < 2) continue;  // warm-up
    t_ar.push_back(ta);
    t_rs.push_back(tb);
    w_ar += wa;
    w_rs += wb;
    mismatched += a.ne(b).sum().item<int64_t>();
    max_abs = std::max(max_abs, (a - b).abs().max().item<double>());
  }
  // Totals over the ranks: mismatched elements, bytes written, and the largest difference.
  std::vector<torch::Tensor> totals{torch::tensor({static_cast<double>(mismatched), static_cast<double>(w_ar),
                                                   static_cast<double>(w_rs)}, torch::kFloat64)};
  group->allreduce(totals)->wait();
  std::vector<torch::Tensor> largest{torch::tensor({max_abs}, torch::kFloat64)};
  c10d::AllreduceOptions max_options;
  max_options.reduceOp = c10d::ReduceOp::MAX;
  group->allreduce(largest, max_options)->wait();
  if (rank == 0) {
    const auto t = totals[0];
    const double per_rank_ar = t[1].item<double>() / world / iters, per_rank_rs = t[2].item<double>() / world / iters;
    std::cout << fmt::format(
                     "{{\"method\":\"allreduce_slice\",\"world\":{},\"numel\":{},\"budgets\":\"{}\",\"median_ms\":{:.1f},"
                     "\"sent_MB_per_rank\":{:.1f},\"payload_MB\":{:.1f}}}",
                     world, numel, budgets_text, 1e3 * median(t_ar), per_rank_ar / 1e6, numel * 4 / 1e6)
              << std::endl;
    std::cout << fmt::format(
                     "{{\"method\":\"reduce_scatter_padded\",\"world\":{},\"numel\":{},\"budgets\":\"{}\","
                     "\"median_ms\":{:.1f},\"sent_MB_per_rank\":{:.1f},\"payload_MB\":{:.1f},\"padding_MB\":{:.1f}}}",
                     world, numel, budgets_text, 1e3 * median(t_rs), per_rank_rs / 1e6, world * max_shard * 4 / 1e6,
                     (world * max_shard - numel) * 4 / 1e6)
              << std::endl;
    std::cout << fmt::format(
                     "{{\"compare\":\"reduce_scatter_padded vs allreduce_slice\",\"repetitions\":{},"
                     "\"mismatched_elements\":{},\"mismatched_fraction\":{:.3f},\"max_abs_diff\":{:.3g},\"bit_identical\":{}}}",
                     iters, static_cast<int64_t>(t[0].item<double>()), t[0].item<double>() / (iters * numel),
                     largest[0].item<double>(),
                     t[0].item<double>() == 0 ? "true" : "false")
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const hetseq::UsageError& e) {
    std::cerr << "zero-reduce: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "zero-reduce: error: " << e.what() << std::endl;
    return 1;
  }
}
