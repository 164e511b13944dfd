// A rank's vote to stop rides with the update's statistics (Note [Clean stops], Note [Stat sync]):
// every rank learns it from the same collective, whatever path the statistics take.
#include <catch2/catch.hpp>

#include "hetseq/distributed/stat_sync.h"
#include "support/rank_threads.h"

using namespace hetseq;
using namespace hetseq::test;

TEST_CASE("one rank's stop vote reaches every rank with the statistics, in no extra collective", "[stat-sync][stop]") {
  OneIntraOpThread one_thread;
  for (const bool fast : {false, true}) {
    CAPTURE(fast);
    std::vector<std::vector<int64_t>> votes(3);   // [rank][call]
    std::vector<std::vector<int64_t>> rounds(3);  // [rank][call]
    std::vector<std::vector<double>> losses(3);   // [rank][call]
    run_ranks(3, [&](int rank, const Group& group) {
      StatSync sync(group, c10::Device(c10::kCPU), fast);
      // Calls: first (names new), steady, steady with rank 2 voting, names changed with rank 0 voting.
      const std::vector<LogSums> sums{{{"loss", 1.0 + rank}, {"sample_size", 4}},
                                      {{"loss", 2.0 + rank}, {"sample_size", 4}},
                                      {{"loss", 3.0 + rank}, {"sample_size", 4}},
                                      {{"loss", 4.0 + rank}, {"nll_loss", 1}, {"sample_size", 4}}};
      const std::vector<bool> vote{false, false, rank == 2, rank == 0};
      for (size_t k = 0; k < sums.size(); ++k) {
        sync.start(sums[k], StatSync::kUpdate, vote[k]);
        losses[rank].push_back(sync.finish().at("loss"));
        votes[rank].push_back(sync.last_stop_votes());
        rounds[rank].push_back(sync.last_extra_rounds());
      }
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(votes[r] == std::vector<int64_t>{0, 0, 1, 1});
      CHECK(losses[r] == std::vector<double>{6, 9, 12, 15});
      CHECK(rounds[r][2] == 0);  // the vote cost the steady state nothing
    }
  }
}
