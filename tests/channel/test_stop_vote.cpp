// A rank's vote to stop rides with the update's statistics (Note [Clean stops], Note [Stat sync]):
// every rank learns it from the same collective, whatever path the statistics take.
#include <catch2/catch.hpp>

#include "support/counting_backend.h"
#include "hetseq/channel/stat_sync.h"
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
      CountingBackend* counter = counting_backend(group);
      if (counter == nullptr) throw std::logic_error("the rank threads' group does not count its collectives");
      for (size_t k = 0; k < sums.size(); ++k) {
        const size_t before = counter->count();  // counted by the group's backend, not by StatSync
        sync.start(sums[k], StatSync::kUpdate, vote[k]);
        losses[rank].push_back(sync.finish().at("loss"));
        votes[rank].push_back(sync.last_stop_votes());
        rounds[rank].push_back(static_cast<int64_t>(counter->count() - before));
      }
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(votes[r] == std::vector<int64_t>{0, 0, 1, 1});
      CHECK(losses[r] == std::vector<double>{6, 9, 12, 15});
      // One collective per call in the steady state, the vote's included; more where names change.
      CHECK(rounds[r][1] == 1);
      CHECK(rounds[r][2] == 1);  // the vote cost the steady state nothing
      CHECK(rounds[r][3] > 1);
    }
  }
}
