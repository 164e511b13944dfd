// --debug-collectives: c10d's ProcessGroupWrapper checks each collective across the ranks before it
// runs (hetseq/world/process_group.h).
#include <stdexcept>
#include <thread>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "support/counting_backend.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/world/process_group.h"
#include "support/mnist_files.h"
#include "support/rank_threads.h"
#include "support/subprocess.h"

using namespace hetseq;
using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// Runs `body(rank, group)` on two threads with --debug-collectives groups over one store; returns
// each rank's error message ("" when it returned). `counted`: a CountingBackend under the checks.
std::vector<std::string> two_checked_ranks(
    const std::function<void(int, const c10::intrusive_ptr<c10d::ProcessGroup>&)>& body, bool counted = false) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ProcessGroupOptions options;
        options.timeout = 20s;
        options.debug_collectives = true;
        if (counted) options.wrap_backend = count_collectives;
        body(r, make_process_group(store, r, 2, options));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("with --debug-collectives, ranks that reach different collectives fail naming the rank and operation",
          "[distributed][debug-collectives]") {
  SECTION("matching collectives run as usual") {
    std::vector<double> sums(2);
    const auto errors = two_checked_ranks([&](int rank, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
      std::vector<torch::Tensor> t{torch::full({4}, rank + 1.0)};
      group->allreduce(t)->wait();
      sums[rank] = t[0].sum().item<double>();
    });
    CHECK(errors == std::vector<std::string>{"", ""});
    CHECK(sums == std::vector<double>{12, 12});
  }
  SECTION("sizes differ") {
    const auto errors = two_checked_ranks([](int rank, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
      std::vector<torch::Tensor> t{torch::ones({rank == 0 ? 4 : 5})};
      group->allreduce(t)->wait();
    });
    for (const auto& e : errors) {
      INFO(e);
      CHECK_THAT(e, Contains("mismatch") && Contains("ALLREDUCE") && Contains("Rank 0") && Contains("Rank 1"));
    }
  }
  SECTION("operations differ") {
    const auto errors = two_checked_ranks([](int rank, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
      std::vector<torch::Tensor> t{torch::ones({4})};
      if (rank == 0) {
        group->allreduce(t)->wait();
      } else {
        group->broadcast(t)->wait();
      }
    });
    for (const auto& e : errors) {
      INFO(e);
      CHECK_THAT(e, Contains("mismatch") && Contains("ALLREDUCE") && Contains("BROADCAST"));
    }
  }
}

TEST_CASE("with --debug-collectives the gradient buckets go through the checked group, never around it through "
          "shared memory, and --shared-memory-reduce on is a usage error naming both flags",
          "[distributed][debug-collectives][shm]") {
  SECTION("auto: every bucket is an allreduce that the checks passed on to the backend") {
    std::vector<std::vector<int64_t>> checked_allreduces(2), buckets(2);  // [rank][update]
    std::vector<int> in_segment(2, -1), checks(2, -1);
    const auto errors = two_checked_ranks(
        [&](int rank, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
          torch::manual_seed(1);
          torch::nn::Sequential mlp(torch::nn::Linear(6, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
          DdpOptions options;  // --shared-memory-reduce auto, which ranks of one machine would take
          options.bucket_cap_mb = 0.0005;
          DistributedReducer reducer(*mlp, group, options);
          checks[rank] = checks_collectives(group) ? 1 : 0;
          // Under the wrapper: it counts what the checks let through to Gloo.
          CountingBackend* counter = counting_backend(group);
          if (!counter) throw std::runtime_error("no counting backend under the checks");
          for (int update = 0; update < 2; ++update) {
            const size_t before = counter->count();
            torch::Tensor loss = mlp->forward(torch::full({2, 6}, rank + 1.0)).sum();
            reducer.before_backward(0, 1, loss);
            loss.backward();
            reducer.finish_update();
            int64_t n = 0;
            const auto records = counter->records();
            for (size_t i = before; i < records.size(); ++i) {
              n += records[i].op == "allreduce" && records[i].dtype == torch::kFloat32;
            }
            checked_allreduces[rank].push_back(n);
            buckets[rank].push_back(reducer.last_timing().buckets);
          }
          in_segment[rank] = reducer.gradients_in_shared_memory() ? 1 : 0;
        },
        /*counted=*/true);
    CHECK(errors == std::vector<std::string>{"", ""});
    CHECK(checks == std::vector<int>{1, 1});
    CHECK(in_segment == std::vector<int>{0, 0});
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      for (int update = 0; update < 2; ++update) {
        CAPTURE(update);
        CHECK(buckets[r][update] >= 2);
        CHECK(checked_allreduces[r][update] == buckets[r][update]);
      }
    }
  }
  SECTION("on: a usage error on every rank") {
    const auto errors = two_checked_ranks([&](int, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
      torch::manual_seed(1);
      torch::nn::Linear model(3, 2);
      DdpOptions options;
      options.shared_memory = SharedMemoryReduceMode::kOn;
      DistributedReducer reducer(*model, group, options);
    });
    for (const auto& e : errors) {
      INFO(e);
      CHECK_THAT(e, Contains("--shared-memory-reduce on cannot be combined with --debug-collectives: gradient "
                             "buckets summed through shared memory bypass the checks of every collective"));
    }
  }
}

TEST_CASE("training with --debug-collectives gives the same model as without", "[distributed][debug-collectives]") {
  TempDir dir;
  write_random_mnist(dir.path(), 96, 16);
  auto run = [&](const std::string& name, bool debug) {
    std::vector<std::string> args{binary_path("hetseq-train"), "--task", "mnist", "--data", dir.path(), "--cpu",
                                  "--optimizer", "sgd", "--lr", "0.05", "--dropout", "0,0", "--num-workers", "0",
                                  "--intra-op-threads", "1", "--no-progress-bar", "--max-sentences", "8,16",
                                  "--distributed-gpus", "2", "--max-update", "4", "--disable-validation",
                                  "--save-dir", dir / name, "--seed", "3"};
    if (debug) args.push_back("--debug-collectives");
    return run_process(args, 300s);
  };
  const auto plain = run("plain", false);
  const auto checked = run("checked", true);
  INFO(plain.err << checked.err);
  REQUIRE(plain.exit_code == 0);
  REQUIRE(checked.exit_code == 0);
  // The checks were really on in the second run, and only there.
  const std::string on = "[process-group] --debug-collectives: rank 0 checks every collective across the 2 ranks";
  CHECK_THAT(checked.err, Catch::Contains(on));
  CHECK_THAT(plain.err, !Catch::Contains("--debug-collectives"));
  // The buckets went through the checked group (Note [Shared memory and --debug-collectives]); without the checks
  // the two ranks of this machine sum them through shared memory.
  CHECK_THAT(checked.err, Catch::Contains("[reducer] --debug-collectives: the gradient buckets go through the process "
                                          "group, where they are checked, not through shared memory") &&
                              !Catch::Contains("sum their gradients through shared memory"));
  CHECK_THAT(plain.err, Catch::Contains("the 2 ranks, all on this machine, sum their gradients through shared memory"));
  torch::Tensor a, b;
  for (const auto& [name, t] : std::vector<std::pair<std::string, torch::Tensor*>>{{"plain", &a}, {"checked", &b}}) {
    const auto c = hetseq::load_checkpoint(dir / (name + "/checkpoint_last.pt"));
    std::vector<torch::Tensor> flat;
    for (const auto& [n, p] : c.model) flat.push_back(p.flatten());
    *t = torch::cat(flat);
  }
  CHECK(torch::equal(a, b));
}
