// The statistics channel's GPU layout on a GPU (Note [Stat sync]): two ranks as threads on one device, the host's
// rows on a host group and the device statistics, CUDA tensors, in a collective of their own over Gloo (the path
// of a GPU rank beside CPU ranks, and of --distributed-backend gloo on GPUs; NCCL needs a GPU a rank). The sums
// left on the device are the ranks' values in rank order, the host's sums come at once, and the rank's thread
// makes no synchronizing CUDA call in a steady-state round (CUDA's sync debug mode).
#include <vector>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#ifdef HETSEQ_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "cuda/cuda_skip.h"
#include "cuda/sync_counter.h"
#include "hetseq/channel/stat_sync.h"
#include "support/rank_threads.h"

namespace cuda_stat_sync {

struct Round {
  hetseq::LogSums host;       // finish()'s sums
  hetseq::LogSums totals;     // the late sums, read on the host after the round
  bool rows_on_cuda = false;
  int64_t extra_rounds = -1;
  int64_t syncs = -1;
};

}  // namespace cuda_stat_sync

TEST_CASE("CUDA: the statistics of two ranks on one GPU sum on the device, with the host's part on a host group and "
          "no synchronizing call in a steady round",
          "[cuda][stat-sync]") {
  if (!hetseq::test::cuda_or_skip()) return;
#ifdef HETSEQ_WITH_CUDA
  const torch::Device gpu(torch::kCUDA, 0);
  for (const bool fast : {false, true}) {
    INFO("fast " << fast);
    std::vector<std::vector<cuda_stat_sync::Round>> rounds(2);  // [rank][round]
    const auto store = c10::make_intrusive<c10d::HashStore>();
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    hetseq::test::run_ranks(2, [&](int rank, const hetseq::test::Group& group) {
      c10::cuda::set_device(0);
      const auto host = hetseq::test::second_group(rank, 2, store, fast ? "host-fast" : "host");
      hetseq::StatSync sync(group, gpu, fast, host);
      for (int k = 0; k < 3; ++k) {
        const auto on_gpu = torch::TensorOptions().dtype(torch::kFloat64).device(gpu);
        const hetseq::LogTensors device{{"loss", torch::full({}, 0.25 + rank + k, on_gpu)},
                                        {"correct", torch::full({}, 3.0 * (rank + 1), on_gpu)}};
        const hetseq::LogSums local{{"sample_size", 4.0 + rank}, {"ntokens", 10.0}};
        torch::cuda::synchronize();
        cuda_stat_sync::Round r;
        hetseq::LateSums late;
        {
          hetseq::test::SyncCounter counter(/*set_mode=*/false);  // the mode is set above, for both threads
          sync.start(local, device, hetseq::StatSync::kUpdate, false);
          r.host = sync.finish();
          late = sync.take_late();
          r.syncs = counter.syncs;
        }
        r.extra_rounds = sync.last_extra_rounds();
        r.rows_on_cuda = late.rows.defined() && late.rows.is_cuda();
        if (!late.empty()) {
          const torch::Tensor read = late.rows.cpu().contiguous();  // after the round: the late read
          late.add_totals(r.totals, read.const_data_ptr<double>());
        }
        rounds[rank].push_back(r);
      }
    });
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    for (int rank = 0; rank < 2; ++rank) {
      INFO("rank " << rank);
      for (int k = 1; k < 3; ++k) {  // the first round learns the names
        INFO("round " << k);
        const cuda_stat_sync::Round& r = rounds[rank][k];
        CHECK(r.extra_rounds == 0);
        CHECK(r.syncs == 0);
        CHECK(r.rows_on_cuda);
        CHECK(r.host == hetseq::LogSums{{"ntokens", 20.0}, {"sample_size", 9.0}});
        CHECK(r.totals == hetseq::LogSums{{"correct", 9.0}, {"loss", (0.25 + k) + (1.25 + k)}});
      }
      // The first round learns the names (fast: one more round, gathered: the serialised sums, which read the
      // device values once), and its sums are right either way.
      const cuda_stat_sync::Round& first = rounds[rank][0];
      CHECK(first.extra_rounds == (fast ? 1 : 2));
      const hetseq::LogSums& has_loss = first.totals.count("loss") ? first.totals : first.host;
      CHECK(has_loss.at("loss") == 1.5);
      CHECK(first.host.at("sample_size") == 9.0);
    }
  }
#endif
}
