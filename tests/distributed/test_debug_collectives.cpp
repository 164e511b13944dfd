// --debug-collectives: c10d's ProcessGroupWrapper checks each collective across the ranks before it
// runs (hetseq/distributed/process_group.h).
#include <thread>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/distributed/process_group.h"
#include "support/mnist_files.h"
#include "support/rank_threads.h"
#include "support/subprocess.h"

using namespace hetseq;
using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// Runs `body(rank, group)` on two threads with --debug-collectives groups over one store; returns
// each rank's error message ("" when it returned).
std::vector<std::string> two_checked_ranks(
    const std::function<void(int, const c10::intrusive_ptr<c10d::ProcessGroup>&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ProcessGroupOptions options;
        options.timeout = 20s;
        options.debug_collectives = true;
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
  torch::Tensor a, b;
  for (const auto& [name, t] : std::vector<std::pair<std::string, torch::Tensor*>>{{"plain", &a}, {"checked", &b}}) {
    const auto c = hetseq::load_checkpoint(dir / (name + "/checkpoint_last.pt"));
    std::vector<torch::Tensor> flat;
    for (const auto& [n, p] : c.model) flat.push_back(p.flatten());
    *t = torch::cat(flat);
  }
  CHECK(torch::equal(a, b));
}
