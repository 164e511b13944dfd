// The run's keys in the rendezvous store (Note [Rendezvous keys]): prefixes per run and attempt,
// arrivals counted with add(), a rank claimed twice; and the checkpoint fence (Note [Checkpoint fence]).
#include <atomic>
#include <regex>
#include <thread>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "hetseq/core/error.h"
#include "hetseq/world/rendezvous_keys.h"
#include "hetseq/world/save_fence.h"
#include "support/rank_threads.h"
#include "support/subprocess.h"

using namespace hetseq;
using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

TEST_CASE("every key of a run carries its run id and attempt", "[rendezvous][keys]") {
  CHECK(store_prefix({}) == "hetseq/run/0/");
  CHECK(store_prefix({{"TORCHELASTIC_RUN_ID", "job7"}, {"TORCHELASTIC_RESTART_COUNT", "2"}}) == "hetseq/job7/2/");
  CHECK(store_prefix({{"SLURM_JOB_ID", "41"}, {"SLURM_STEP_ID", "3"}}) == "hetseq/slurm-41.3/0/");
  CHECK(store_prefix({{"SLURM_JOB_ID", "41"}, {"SLURM_RESTART_COUNT", "1"}}) == "hetseq/slurm-41/1/");
  // torchrun inside a Slurm job: torchrun's attempt is the one that changes on a restart.
  CHECK(store_prefix({{"SLURM_JOB_ID", "41"}, {"TORCHELASTIC_RUN_ID", "r"}, {"TORCHELASTIC_RESTART_COUNT", "1"}}) ==
        "hetseq/r/1/");
}

TEST_CASE("the start barrier opens once for all ranks and names the missing ones on a timeout",
          "[rendezvous][keys]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::exception_ptr> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        store_barrier(*store, "arrived", r, 3, 20s, "");
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) CHECK(!errors[r]);
  CHECK(store->add("arrived/w3/count", 0) == 3);

  // Ranks 0 and 2 of 4 arrive, 1 and 3 never do.
  auto lonely = c10::make_intrusive<c10d::HashStore>();
  std::exception_ptr error;
  const auto start = std::chrono::steady_clock::now();
  std::thread two([&] {
    try {
      store_barrier(*lonely, "arrived", 2, 4, 1s, "");
    } catch (...) {
    }
  });
  try {
    store_barrier(*lonely, "arrived", 0, 4, 1s, "; hint");
  } catch (...) {
    error = std::current_exception();
  }
  two.join();
  REQUIRE(error);
  CHECK(is_a<PeerError>(error));
  CHECK(message_of(error) == "rank 0: rank(s) 1, 3 of 4 never arrived within 1 s; hint");
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("the checkpoint fence holds the other ranks for a slow save and reports rank 0's failure",
          "[rendezvous][fence]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  // A save of 3 s with 1 s of liveness: rank 0 beats, so the others wait it out.
  std::vector<std::exception_ptr> errors(3);
  std::vector<double> waited(3, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      SaveFence fence(store, r, 3, 1s, 60s);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        fence.run(7, [] { std::this_thread::sleep_for(3s); });
      } catch (...) {
        errors[r] = std::current_exception();
      }
      waited[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << (errors[r] ? message_of(errors[r]) : "ok"));
    CHECK(!errors[r]);
    CHECK(waited[r] >= 2.9);
  }

  // Rank 0's write fails: every other rank gets its message.
  std::exception_ptr other;
  std::thread one([&] {
    try {
      SaveFence(store, 1, 2, 5s, 60s).run(8, [] {});
    } catch (...) {
      other = std::current_exception();
    }
  });
  CHECK_THROWS_WITH(SaveFence(store, 0, 2, 5s, 60s).run(8, [] { throw InputError("--save-dir /x: disk full"); }),
                    "--save-dir /x: disk full");
  one.join();
  REQUIRE(other);
  CHECK(message_of(other) == "rank 1 of 2: rank 0 could not write the checkpoint: --save-dir /x: disk full");
  CHECK(!is_a<PeerError>(other));

  // Rank 0 never comes (died): no heartbeat, a lost peer after the liveness timeout.
  const auto t0 = std::chrono::steady_clock::now();
  try {
    SaveFence(store, 1, 2, 1s, 60s).run(9, [] {});
    FAIL("the fence returned without rank 0");
  } catch (const PeerError& e) {
    CHECK_THAT(e.what(), Contains("rank 0 stopped showing progress while writing the checkpoint at update 9 (no "
                                  "heartbeat for 1 s, --distributed-timeout)"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("two save points at one update count use their own fence keys: the second shares its own value and "
          "waits for its own write",
          "[rendezvous][fence]") {
  // fp16 can skip every update between an interval save and the epoch's end: both save at update 5.
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> shared(2);
  std::vector<std::string> posted;
  std::atomic<bool> second_written{false};
  bool rank1_saw_second_written = false;
  std::exception_ptr failed;
  std::thread one([&] {
    try {
      SaveFence fence(store, 1, 2, 5s, 60s);
      for (int save = 0; save < 2; ++save) {
        shared[static_cast<size_t>(save)] = fence.share(5, "");
        fence.write_part(5, [&] { return "ok from save " + std::to_string(save); });
        fence.run(5, [] {});
      }
      rank1_saw_second_written = second_written;  // written by rank 0 before its run() returned
    } catch (...) {
      failed = std::current_exception();
    }
  });
  SaveFence fence(store, 0, 2, 5s, 60s);
  for (int save = 0; save < 2; ++save) {
    fence.share(5, "save " + std::to_string(save));
    fence.run(5, [&] {
      posted.push_back(fence.collect(5)[1]);
      if (save == 1) {
        std::this_thread::sleep_for(300ms);  // rank 1 must still be waiting
        second_written = true;
      }
    });
  }
  one.join();
  REQUIRE(!failed);
  CHECK(shared == std::vector<std::string>{"save 0", "save 1"});
  CHECK(posted == std::vector<std::string>{"ok from save 0", "ok from save 1"});
  CHECK(rank1_saw_second_written);
}

TEST_CASE("a sharded save waits for a slow writer that beats and gives up on a silent one within the liveness, "
          "naming it, as a lost peer on every rank",
          "[rendezvous][fence]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  // Rank 1 writes its part for 2 s, rank 2 at once, with 1 s of liveness: rank 1's heartbeat keeps rank 0
  // waiting, and every record arrives.
  {
    std::vector<std::string> records;
    std::vector<std::exception_ptr> errors(3);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        try {
          SaveFence fence(store, r, 3, 1s, 60s);
          if (r == 0) {
            fence.run(3, [&] { records = fence.collect(3); });
            return;
          }
          fence.write_part(3, [r] {
            if (r == 1) std::this_thread::sleep_for(2s);
            return "ok " + std::to_string(r);
          });
          fence.run(3, [] {});
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 3; ++r) {
      INFO("rank " << r << ": " << (errors[r] ? message_of(errors[r]) : "ok"));
      CHECK(!errors[r]);
    }
    CHECK(records == std::vector<std::string>{"", "ok 1", "ok 2"});
    CHECK(std::chrono::steady_clock::now() - t0 >= 2s);
  }
  // A write that fails hands rank 0 its error and throws it on the writer.
  {
    std::string record;
    std::thread zero([&] { record = SaveFence(store, 0, 2, 5s, 60s).collect(4)[1]; });
    CHECK_THROWS_WITH(SaveFence(store, 1, 2, 5s, 60s).write_part(4, []() -> std::string {
      throw InputError("--save-dir /x: disk full");
    }),
                      "--save-dir /x: disk full");
    zero.join();
    CHECK(record == "error --save-dir /x: disk full");
  }
  // Rank 1 died before its record (it never beats): rank 0 gives up after the liveness, naming it, and
  // rank 2, which waits for rank 0's verdict, fails with rank 0's words; both as a lost peer (exit 4).
  std::vector<std::exception_ptr> errors(3);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread two([&] {
    try {
      SaveFence fence(store, 2, 3, 1s, 60s);
      fence.write_part(5, [] { return std::string("ok 2"); });
      fence.run(5, [] {});
    } catch (...) {
      errors[2] = std::current_exception();
    }
  });
  try {
    SaveFence fence(store, 0, 3, 1s, 60s);
    fence.run(5, [&] { fence.collect(5); });
  } catch (...) {
    errors[0] = std::current_exception();
  }
  two.join();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  const std::string lost =
      "rank 0 of 3: rank 1 stopped showing progress while writing its part of the checkpoint at update 5 (no "
      "heartbeat for 1 s, --distributed-timeout): it died or hangs";
  REQUIRE(errors[0]);
  CHECK(is_a<PeerError>(errors[0]));
  CHECK(message_of(errors[0]) == lost);
  REQUIRE(errors[2]);
  CHECK(is_a<PeerError>(errors[2]));
  CHECK(message_of(errors[2]) == "rank 2 of 3: rank 0 could not write the checkpoint: " + lost);
}
