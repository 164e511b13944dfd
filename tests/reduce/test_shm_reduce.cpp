// The shared-memory reduction (Note [Shared-memory reduction]) on ranks as threads (level 1, see
// support/rank_threads.h): each rank maps the same segment, as processes of one machine do.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/reduce/shm_reduce.h"
#include "support/rank_threads.h"

using hetseq::SharedMemoryReduce;
using hetseq::test::Group;
using hetseq::test::OneIntraOpThread;
using hetseq::test::run_ranks;
using hetseq::test::run_ranks_collect;
using Catch::Matchers::Contains;

namespace {

// Values with all their mantissa bits in use, different per rank and round (no global generator: the rank threads
// would race on it).
torch::Tensor rank_values(int rank, int64_t n, int64_t round) {
  return torch::arange(n, torch::kFloat32).mul(0.37f * static_cast<float>(rank + 1)).add(static_cast<float>(round)).sin();
}

}  // namespace

TEST_CASE("a shared-memory reduction sums every bucket in rank order, the same bits on every rank", "[distributed][shm]") {
  OneIntraOpThread one_thread;
  // One rank (a world shrunk to one: the sum is the bucket); two; three, where a rank past the first two sums its
  // own term last; four, where a chunk of the smallest buckets is empty.
  const int kWorld = GENERATE(1, 2, 3, 4);
  INFO(kWorld << " ranks");
  // Sizes around the chunk cut (16 elements) and smaller than one chunk per rank, one reduction after another so
  // that both halves of the segment are used, then the same through the background thread.
  const std::vector<int64_t> sizes{1, 5, 47, 48, 49, 1000, 4096, 3, 1000};
  std::vector<std::vector<torch::Tensor>> got(kWorld);  // [rank][round]
  run_ranks(kWorld, [&](int rank, const Group& group) {
    SharedMemoryReduce shm(*group, 4096 * sizeof(float), std::chrono::seconds(20));
    for (size_t round = 0; round < sizes.size(); ++round) {
      torch::Tensor t = rank_values(rank, sizes[round], static_cast<int64_t>(round));
      if (round < 6) {
        shm.allreduce_sum(t, static_cast<int64_t>(round));
      } else {
        auto done = shm.allreduce_sum_async(t, static_cast<int64_t>(round));
        done->wait();
        REQUIRE(!done->hasError());
      }
      got[static_cast<size_t>(rank)].push_back(t);
    }
  });
  for (size_t round = 0; round < sizes.size(); ++round) {
    INFO("round " << round << ", " << sizes[round] << " elements");
    torch::Tensor expected = rank_values(0, sizes[round], static_cast<int64_t>(round)).clone();
    for (int r = 1; r < kWorld; ++r) expected.add_(rank_values(r, sizes[round], static_cast<int64_t>(round)));
    for (int r = 0; r < kWorld; ++r) {
      CHECK(torch::equal(got[static_cast<size_t>(r)][round], expected));
    }
  }
}

TEST_CASE("gradient buckets in shared memory: summed in place in rank order, seen through their views, and a "
          "new layout",
          "[distributed][shm]") {
  OneIntraOpThread one_thread;
  const int kWorld = GENERATE(1, 2, 3, 4);
  INFO(kWorld << " ranks");
  // Two buckets as the Reducer makes them (flat, each with a view per "parameter"), of 5000 and 70 floats; then
  // a rebuilt layout of one bucket of all 5070; bucket 9 fits no place and takes the copying path.
  std::vector<std::vector<torch::Tensor>> got(kWorld);  // [rank][round] the buckets' values after the round
  std::vector<int> moved(kWorld, 0), held_after(kWorld, 0), leftover(kWorld, -1);
  std::vector<torch::Tensor> survivor(kWorld);  // a view that outlives the SharedMemoryReduce
  run_ranks(kWorld, [&](int rank, const Group& group) {
    const auto r = static_cast<size_t>(rank);
    torch::Tensor view_of_first;
    {
      SharedMemoryReduce shm(*group, 8192 * sizeof(float), std::chrono::seconds(20), 5070 * sizeof(float) + 2 * 64);
      shm.set_bucket_layout({5000 * sizeof(float), 70 * sizeof(float)});
      std::vector<torch::Tensor> buckets{torch::empty({5000}), torch::empty({70})};
      torch::Tensor grad = buckets[0].narrow(0, 10, 100);  // a gradient viewing bucket 0
      for (int64_t round = 0; round < 3; ++round) {
        for (size_t b = 0; b < buckets.size(); ++b) {
          buckets[b].copy_(rank_values(rank, buckets[b].numel(), round * 10 + static_cast<int64_t>(b)));
          auto done = shm.allreduce_bucket_async(buckets[b], static_cast<int64_t>(b));
          done->wait();
          REQUIRE(!done->hasError());
          got[r].push_back(buckets[b].clone());
        }
      }
      moved[r] = shm.holds(buckets[0].data_ptr()) && shm.holds(buckets[1].data_ptr()) && shm.holds(grad.data_ptr());
      // The view reads the sum: the storage moved, not a copy of it.
      held_after[r] = torch::equal(grad, buckets[0].narrow(0, 10, 100));
      // A rebuilt layout: one bucket of everything, a new tensor as the Reducer would make.
      shm.set_bucket_layout({5070 * sizeof(float)});
      torch::Tensor all = torch::empty({5070});
      all.copy_(rank_values(rank, 5070, 100));
      shm.allreduce_bucket_async(all, 0)->wait();
      got[r].push_back(all.clone());
      torch::Tensor odd = rank_values(rank, 333, 200);  // index 9: no place in the layout
      shm.allreduce_bucket_async(odd, 9)->wait();
      got[r].push_back(odd.clone());
      leftover[r] = shm.holds(odd.data_ptr()) ? 1 : 0;
      view_of_first = all.narrow(0, 5000, 70);
    }
    survivor[r] = view_of_first;  // the segment is still mapped for it
  });
  std::vector<std::pair<int64_t, int64_t>> rounds;  // (elements, round seed) in the order of `got`
  for (int64_t round = 0; round < 3; ++round) rounds.insert(rounds.end(), {{5000, round * 10}, {70, round * 10 + 1}});
  rounds.insert(rounds.end(), {{5070, 100}, {333, 200}});
  for (size_t i = 0; i < rounds.size(); ++i) {
    INFO("reduction " << i << " (" << rounds[i].first << " elements)");
    torch::Tensor expected = rank_values(0, rounds[i].first, rounds[i].second).clone();
    for (int r = 1; r < kWorld; ++r) expected.add_(rank_values(r, rounds[i].first, rounds[i].second));
    for (int r = 0; r < kWorld; ++r) CHECK(torch::equal(got[static_cast<size_t>(r)][i], expected));
  }
  CHECK(moved == std::vector<int>(kWorld, 1));
  CHECK(held_after == std::vector<int>(kWorld, 1));
  CHECK(leftover == std::vector<int>(kWorld, 0));
  torch::Tensor last = rank_values(0, 5070, 100).clone();
  for (int r = 1; r < kWorld; ++r) last.add_(rank_values(r, 5070, 100));
  for (int r = 0; r < kWorld; ++r) CHECK(torch::equal(survivor[static_cast<size_t>(r)], last.narrow(0, 5000, 70)));
}

TEST_CASE("a rank that never reaches a shared-memory reduction is a PeerError naming it, within the timeout",
          "[distributed][shm]") {
  OneIntraOpThread one_thread;
  std::atomic<bool> failed{false};
  const auto errors = run_ranks_collect(2, [&](int rank, const Group& group) {
    SharedMemoryReduce shm(*group, 1024, std::chrono::seconds(1));
    if (rank == 1) {
      while (!failed) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // alive, but never reduces
      return;
    }
    torch::Tensor t = torch::ones({8});
    const auto start = std::chrono::steady_clock::now();
    try {
      shm.allreduce_sum(t, 3);
    } catch (...) {
      failed = true;
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(5)) throw std::runtime_error("too late");
      throw;
    }
    failed = true;
  });
  REQUIRE(errors[0]);
  CHECK(hetseq::test::is_a<hetseq::PeerError>(errors[0]));
  CHECK_THAT(hetseq::test::message_of(errors[0]),
             Contains("rank 0 of 2: the shared-memory reduction of gradient bucket 3 (copy in) failed: rank(s) 1 did "
                      "not reach it within --distributed-timeout (1 s)"));
  CHECK(!errors[1]);
}

TEST_CASE("auto: one rank that cannot take part turns shared memory off on every rank, saying why", "[distributed][shm]") {
  OneIntraOpThread one_thread;
  std::vector<std::string> why(2);
  std::vector<int> made(2, -1);
  run_ranks(2, [&](int rank, const Group& group) {
    std::string reason;
    auto shm = SharedMemoryReduce::try_create(*group, 1024, std::chrono::seconds(10), /*eligible=*/rank == 0, &reason);
    made[static_cast<size_t>(rank)] = shm ? 1 : 0;
    why[static_cast<size_t>(rank)] = reason;
  });
  CHECK(made == std::vector<int>{0, 0});
  CHECK_THAT(why[0], Contains("rank 1 runs on another machine than rank 0") &&
                         Contains("has its parameters off the CPU"));
  CHECK(why[0] == why[1]);
  SECTION("and both eligible, both take it") {
    run_ranks(2, [&](int rank, const Group& group) {
      std::string reason;
      auto shm = SharedMemoryReduce::try_create(*group, 1024, std::chrono::seconds(10), true, &reason);
      made[static_cast<size_t>(rank)] = shm ? 1 : 0;
    });
    CHECK(made == std::vector<int>{1, 1});
  }
}

TEST_CASE("auto: a segment /dev/shm cannot hold leaves both ranks on the process group, told it was the segment",
          "[distributed][shm]") {
  OneIntraOpThread one_thread;
  std::vector<std::string> why(2);
  std::vector<int> made(2, -1), segment_failed(2, -1);
  // Slots of 1 TiB each: far more than /dev/shm holds on any machine, refused before a page is taken.
  constexpr size_t kHuge = size_t{1} << 40;
  run_ranks(2, [&](int rank, const Group& group) {
    std::string reason;
    bool failed = false;
    auto shm = SharedMemoryReduce::try_create(*group, kHuge, std::chrono::seconds(10), true, &reason, &failed);
    made[static_cast<size_t>(rank)] = shm ? 1 : 0;
    segment_failed[static_cast<size_t>(rank)] = failed ? 1 : 0;
    why[static_cast<size_t>(rank)] = reason;
  });
  CHECK(made == std::vector<int>{0, 0});
  CHECK(segment_failed == std::vector<int>{1, 1});
  CHECK_THAT(why[0], Contains("rank 0 cannot reserve") && Contains("in /dev/shm") && Contains("free /dev/shm"));
  CHECK(why[0] == why[1]);
  // Nothing half-made is left: no segment of this process's in /dev/shm.
  const std::string prefix = "hetseq-reduce-" + std::to_string(::getpid()) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    CHECK(entry.path().filename().string().rfind(prefix, 0) != 0);
  }
  SECTION("where the ranks are not all eligible, the segment is not what failed") {
    run_ranks(2, [&](int rank, const Group& group) {
      std::string reason;
      bool failed = true;
      auto shm = SharedMemoryReduce::try_create(*group, kHuge, std::chrono::seconds(10), rank == 0, &reason, &failed);
      segment_failed[static_cast<size_t>(rank)] = failed ? 1 : 0;
    });
    CHECK(segment_failed == std::vector<int>{0, 0});
  }
}

TEST_CASE("shared memory with ranks that sit out: the members sum among themselves, in rank order, in place and "
          "copied, and a rank taken back sums with them again",
          "[distributed][shm][sit-out]") {
  OneIntraOpThread one_thread;
  // Three ranks with rank 1 out; four with rank 2 out (a member after the one out).
  const int kWorld = GENERATE(3, 4);
  const int out = kWorld == 3 ? 1 : 2;
  INFO(kWorld << " ranks, rank " << out << " out");
  std::vector<int> members;
  for (int r = 0; r < kWorld; ++r) {
    if (r != out) members.push_back(r);
  }
  std::vector<int> everyone(members);
  everyone.insert(std::upper_bound(everyone.begin(), everyone.end(), out), out);
  // [rank][reduction]: all ranks once, the members twice (in place, then copied), all ranks again.
  std::vector<std::vector<torch::Tensor>> got(kWorld);
  std::vector<int> untouched(kWorld, -1);  // the bucket of the rank that sat out kept its own values
  run_ranks(kWorld, [&](int rank, const Group& group) {
    const auto r = static_cast<size_t>(rank);
    SharedMemoryReduce shm(*group, 4096 * sizeof(float), std::chrono::seconds(20), 1000 * sizeof(float));
    shm.set_bucket_layout({1000 * sizeof(float)});
    torch::Tensor bucket = torch::empty({1000});
    auto reduce_in_place = [&](int64_t seed) {
      bucket.copy_(rank_values(rank, 1000, seed));
      shm.allreduce_bucket_async(bucket, 0)->wait();
      got[r].push_back(bucket.clone());
    };
    reduce_in_place(0);
    shm.set_members(members);
    if (rank != out) {
      reduce_in_place(1);
      torch::Tensor copied = rank_values(rank, 333, 2);
      shm.allreduce_sum(copied, 5);
      got[r].push_back(copied);
    } else {
      bucket.copy_(rank_values(rank, 1000, 1));
    }
    group->barrier()->wait();  // every rank between updates: the members are done
    if (rank == out) untouched[r] = torch::equal(bucket, rank_values(rank, 1000, 1)) ? 1 : 0;
    shm.set_members(everyone);
    reduce_in_place(3);
  });
  auto sum_over = [&](const std::vector<int>& ranks, int64_t n, int64_t seed) {
    torch::Tensor s = rank_values(ranks[0], n, seed).clone();
    for (size_t i = 1; i < ranks.size(); ++i) s.add_(rank_values(ranks[i], n, seed));
    return s;
  };
  for (int rank = 0; rank < kWorld; ++rank) {
    INFO("rank " << rank);
    const auto& g = got[static_cast<size_t>(rank)];
    if (rank == out) {
      REQUIRE(g.size() == 2);
      CHECK(torch::equal(g[0], sum_over(everyone, 1000, 0)));
      CHECK(torch::equal(g[1], sum_over(everyone, 1000, 3)));
      CHECK(untouched[static_cast<size_t>(rank)] == 1);
      continue;
    }
    REQUIRE(g.size() == 4);
    CHECK(torch::equal(g[0], sum_over(everyone, 1000, 0)));
    CHECK(torch::equal(g[1], sum_over(members, 1000, 1)));
    CHECK(torch::equal(g[2], sum_over(members, 333, 2)));
    CHECK(torch::equal(g[3], sum_over(everyone, 1000, 3)));
  }
}
