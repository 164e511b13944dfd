// --zero-sharding os with real hetseq-train processes over loopback (level 2 of STYLE's test levels):
// the sharded run trains the parameters of the unsharded one, and each rank's optimizer state follows
// its --memory-budget. See Note [Sharded optimizer state].
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/core/error.h"
#include "bert/shard_writer.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/test_paths.h"
#include "tasks/mnist/mnist_model.h"

using namespace hetseq::test;
using namespace std::chrono_literals;

namespace {

// The first 2500 training images of the shipped Fashion-MNIST (no validation), written once per test process.
const std::string& zero_sharding_data() { return fashion_mnist_prefix(2500, 100); }

// One rank per batch size (default 3 ranks with batches 7, 13, 29) and (under os and os+grad) the given budgets
// in GB: Adam with weight decay and --clip-norm (which clips at every update here) up to update `updates`,
// resuming from the checkpoint in `dir`/ck when there is one; the optimizer state is saved unless `save_state`
// is false.
std::vector<ProcessResult> train(const std::string& dir, const std::string& sharding,
                                 const std::vector<std::string>& budgets = {"1", "1", "2"}, int updates = 30,
                                 bool save_state = false, const std::vector<std::string>& more = {},
                                 const std::vector<int>& batches = {7, 13, 29}) {
  std::vector<std::vector<std::string>> commands;
  for (size_t r = 0; r < batches.size(); ++r) {
    auto args = with(mnist_train_args(zero_sharding_data(), dir + "/ck"),
                     {"--dropout", "0,0", "--weight-decay", "0.01", "--clip-norm", "0.5", "--max-update",
                      std::to_string(updates), "--disable-validation", "--max-sentences", std::to_string(batches[r]),
                      "--zero-sharding", sharding});
    if (batches.size() > 1) {
      args = with(args, {"--distributed-world-size", std::to_string(batches.size()), "--distributed-rank",
                         std::to_string(r), "--distributed-init-method",
                         "file://" + dir + "/rendezvous" + std::to_string(updates)});
    }
    if (sharding != "none") args = with(args, {"--memory-budget", budgets[r]});
    if (!save_state) args = with(args, {"--no-save-optimizer-state"});
    args = with(args, more);
    commands.push_back(args);
  }
  return run_processes(commands, 300s);
}

// Every update's loss and gradient norm of `got` ([update] its `train` lines) within 1e-6 relative of `expected`'s.
void check_losses_match(const std::vector<nlohmann::json>& expected, const std::vector<nlohmann::json>& got,
                        const std::string& mode) {
  REQUIRE(got.size() <= expected.size());
  for (size_t u = 0; u < got.size(); ++u) {
    INFO("update " << u + 1 << ": none " << expected[u].dump() << ", " << mode << " " << got[u].dump());
    for (const char* key : {"loss", "gnorm"}) {
      const double e = expected[u][key].get<double>(), g = got[u][key].get<double>();
      CHECK(std::abs(g - e) <= 1e-6 * std::abs(e));
    }
  }
}

// The bound, 1e-6 relative to the largest weight, and bit for bit (on one machine, where none's shared-memory
// allreduce adds in rank order as the shards' owners do: Note [Sharded gradients]).
void check_weights_match(const std::vector<torch::Tensor>& expected, const std::vector<torch::Tensor>& got) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = (got[i] - expected[i]).abs().max().item<double>() / expected[i].abs().max().item<double>();
    INFO("parameter " << i << ": max |difference| relative to max |weight| " << d);
    CHECK(d <= 1e-6);
    CHECK(torch::equal(got[i], expected[i]));
  }
}

}  // namespace

TEST_CASE("Sharding os, os+grad and full with budgets 1:1:2 and batches 16/24/40 train the parameters of "
          "--zero-sharding none, bit for bit, and the ranks hold their shards of the gradients and parameters",
          "[distributed][multiprocess][zero_shard]") {
  const std::vector<int> batches{16, 24, 40};
  TempDir none_dir, os_dir, grad_dir;
  const auto none = train(none_dir.path(), "none", {}, 30, false, {}, batches);
  require_all(none, "none");
  // os for 5 updates (its weights after many updates are none's in the resume test below): its losses and
  // norms are none's, and its shard lines give the plan that os+grad and full share.
  const auto os = train(os_dir.path(), "os", {"1", "1", "2"}, 5, false, {}, batches);
  require_all(os, "os");
  const auto none_lines = json_lines(none[0].out, "train");
  const auto os_lines = json_lines(os[0].out, "train");
  REQUIRE(none_lines.size() == 30);
  REQUIRE(os_lines.size() == 5);
  for (size_t u = 0; u < 5; ++u) {
    INFO("update " << u + 1 << ": none " << none_lines[u].dump() << ", os " << os_lines[u].dump());
    CHECK(os_lines[u]["loss"].get<double>() == none_lines[u]["loss"].get<double>());
    CHECK(os_lines[u]["gnorm"].get<double>() == none_lines[u]["gnorm"].get<double>());
  }

  const auto expected = mnist_params_of(none_dir / "ck/checkpoint_last.pt");
  int64_t total = 0;
  for (const auto& p : expected) total += p.numel();

  // Rank 0 prints one shard line per rank; the state is Adam's two float32 moments of the shard.
  const auto shards = json_lines(os[0].out, "shard");
  REQUIRE(shards.size() == 3);
  const std::vector<double> share{0.25, 0.25, 0.5};
  int64_t next = 0, state = 0;
  for (size_t r = 0; r < 3; ++r) {
    INFO(shards[r].dump());
    CHECK(shards[r]["rank"].get<int64_t>() == static_cast<int64_t>(r));
    CHECK(shards[r]["first"].get<int64_t>() == next);
    const int64_t numel = shards[r]["numel"].get<int64_t>();
    next += numel;
    CHECK(std::abs(static_cast<double>(numel) - share[r] * static_cast<double>(total)) <= 16);
    CHECK(shards[r]["state_bytes"].get<int64_t>() == 2 * 4 * numel);
    CHECK(shards[r]["budget_bytes"].get<int64_t>() == (r == 2 ? 2LL : 1LL) << 30);
    // os shards the state alone: every rank holds the whole model's float32 parameters and gradients.
    CHECK(shards[r]["param_bytes"].get<int64_t>() == 4 * total);
    CHECK(shards[r]["grad_bytes"].get<int64_t>() == 4 * total);
    state += shards[r]["state_bytes"].get<int64_t>();
  }
  CHECK(next == total);
  CHECK(state == 2 * 4 * total);  // the unsharded run's state, split
  CHECK(json_lines(none[0].out, "shard").empty());

  // os+grad: the gradients summed on their shard's rank (Note [Sharded gradients]).
  const auto grad = train(grad_dir.path(), "os+grad", {"1", "1", "2"}, 30, false, {}, batches);
  require_all(grad, "os+grad");
  // Every update's loss and gradient norm (clip 0.5 clips them all here), the norm from the ranks' partial norms.
  const auto expected_lines = json_lines(none[0].out, "train");
  const auto got_lines = json_lines(grad[0].out, "train");
  REQUIRE(got_lines.size() == 30);
  check_losses_match(expected_lines, got_lines, "os+grad");
  check_weights_match(expected, mnist_params_of(grad_dir / "ck/checkpoint_last.pt"));
  // The shard lines: gradients and state in the budgets' proportion 1:1:2 (each shard the os run's); the
  // parameters whole on every rank; no parameter's own gradient left after the reduction.
  const auto grad_shards = json_lines(grad[0].out, "shard");
  REQUIRE(grad_shards.size() == 3);
  int64_t grads = 0;
  for (size_t r = 0; r < 3; ++r) {
    INFO(grad_shards[r].dump());
    const int64_t numel = grad_shards[r]["numel"].get<int64_t>();
    CHECK(numel == shards[r]["numel"].get<int64_t>());
    CHECK(grad_shards[r]["grad_bytes"].get<int64_t>() == 4 * numel);
    CHECK(grad_shards[r]["state_bytes"].get<int64_t>() == 2 * 4 * numel);
    CHECK(grad_shards[r]["param_bytes"].get<int64_t>() == 4 * total);
    grads += grad_shards[r]["grad_bytes"].get<int64_t>();
  }
  CHECK(grads == 4 * total);

  // full: the parameters sharded too, each unit (MNIST's 4 layers) gathered around its passes (Note [Sharded
  // parameters]): the weights of none bit for bit, and parameters, gradients and state in the proportion 1:1:2.
  TempDir full_dir;
  const auto full = train(full_dir.path(), "full", {"1", "1", "2"}, 30, false, {}, batches);
  require_all(full, "full");
  CHECK_THAT(full[0].err, Catch::Contains("[zero] full: 4 unit(s) of task mnist's model"));
  const auto full_lines = json_lines(full[0].out, "train");
  REQUIRE(full_lines.size() == 30);
  check_losses_match(expected_lines, full_lines, "full");
  check_weights_match(expected, mnist_params_of(full_dir / "ck/checkpoint_last.pt"));
  const auto full_shards = json_lines(full[0].out, "shard");
  REQUIRE(full_shards.size() == 3);
  const int64_t quarter = full_shards[0]["param_bytes"].get<int64_t>();
  int64_t params = 0;
  for (size_t r = 0; r < 3; ++r) {
    INFO(full_shards[r].dump());
    const int64_t numel = full_shards[r]["numel"].get<int64_t>();
    CHECK(numel == shards[r]["numel"].get<int64_t>());
    // Every parameter of MNIST's model is in a unit: a rank holds its shard of them and nothing else.
    CHECK(full_shards[r]["param_bytes"].get<int64_t>() == 4 * numel);
    CHECK(full_shards[r]["grad_bytes"].get<int64_t>() == 4 * numel);
    CHECK(full_shards[r]["state_bytes"].get<int64_t>() == 2 * 4 * numel);
    // 1:1:2 within 5%.
    for (const char* key : {"param_bytes", "grad_bytes", "state_bytes"}) {
      const double ratio = static_cast<double>(full_shards[r][key].get<int64_t>()) /
                           static_cast<double>(full_shards[0][key].get<int64_t>());
      CHECK(std::abs(ratio - (r == 2 ? 2.0 : 1.0)) <= 0.05 * (r == 2 ? 2.0 : 1.0));
    }
    params += full_shards[r]["param_bytes"].get<int64_t>();
  }
  CHECK(quarter > 0);
  CHECK(params == 4 * total);
}

TEST_CASE("At three ranks a steady-state update reads nothing from the device, unsharded and under full (its count "
          "of passes in host memory), counted by the dispatcher",
          "[distributed][multiprocess][zero_shard][sync]") {
  // --step-profile counts the reads of updates 4 to 9 on rank 0 (Note [Step profile]); the statistics and the
  // count of passes go in host memory (Note [Stat sync]), the norm is read after the next update (Note [Reading
  // an update late]).
  for (const std::string sharding : {"none", "full"}) {
    INFO("--zero-sharding " << sharding);
    TempDir dir;
    const auto ranks = train(dir.path(), sharding, {"1", "1", "2"}, 12, false, {"--step-profile", "3,6"});
    require_all(ranks, sharding);
    const auto profile = json_lines(ranks[0].out, "step_profile");
    REQUIRE(profile.size() == 1);
    CHECK(profile.front()["timed_updates"] == 6);
    CHECK(profile.front()["aten_ops_per_update"].get<double>() > 50);  // the counter saw the updates
    CHECK(profile.front()["host_reads_per_update"] == 0);
  }
}

TEST_CASE("Sharding full with update-freqs 2/1/1, validation and an epoch's uneven end (stand-in passes) trains and "
          "validates as none, bit for bit, and resumes so at any update: mid-epoch, before the short end, at it",
          "[distributed][multiprocess][zero_shard]") {
  // 500 samples at 32 + 24 + 40 an update: update 6 ends epoch 1 with 20 samples, all rank 0's, so ranks 1 and 2
  // have no samples for it, and rank 0 runs 2 micro-batches an update where the others run 1; the 100 test
  // images give the ranks unequal validation batches. Under full a rank without samples for a pass runs a
  // stand-in (Note [Stand-in passes]). Two epochs, a checkpoint and a validation after every update; then the
  // full run resumed from its checkpoints at update 3 (mid-epoch), 5 (the update before the short end: the
  // resumed process's first update has ranks without samples) and 6 (the short end itself), each to update 12.
  auto run = [](const std::string& dir, const std::string& sharding, const std::vector<std::string>& more) {
    const std::vector<int> batches{16, 24, 40};
    const std::vector<std::string> freqs{"2", "1", "1"}, budgets{"1", "1", "2"};
    std::vector<std::vector<std::string>> commands;
    for (size_t r = 0; r < 3; ++r) {
      auto args = with(mnist_train_args(fashion_mnist_prefix(500, 100), dir + "/ck"),
                       {"--dropout", "0,0", "--weight-decay", "0.01", "--clip-norm", "0.5", "--max-update", "12",
                        "--max-sentences", std::to_string(batches[r]), "--update-freq", freqs[r], "--zero-sharding",
                        sharding, "--distributed-world-size", "3", "--distributed-rank", std::to_string(r),
                        "--distributed-init-method", "file://" + dir + "/rendezvous"});
      if (sharding != "none") args = with(args, {"--memory-budget", budgets[r]});
      commands.push_back(with(args, more));
    }
    return run_processes(commands, 300s);
  };
  TempDir none_dir, full_dir;
  const auto none = run(none_dir.path(), "none", {"--save-interval-updates", "1", "--no-save-optimizer-state"});
  require_all(none, "none");
  const auto full = run(full_dir.path(), "full", {"--save-interval-updates", "1"});
  require_all(full, "full");
  const auto expected_valid = json_lines(none[0].out, "valid");
  const auto got_valid = json_lines(full[0].out, "valid");
  REQUIRE(expected_valid.size() >= 12);
  REQUIRE(got_valid.size() == expected_valid.size());
  for (size_t v = 0; v < expected_valid.size(); ++v) {
    INFO("none " << expected_valid[v].dump() << ", full " << got_valid[v].dump());
    CHECK(got_valid[v]["loss"].get<double>() == expected_valid[v]["loss"].get<double>());
    CHECK(got_valid[v]["sample_size"].get<double>() == 100);
  }
  const auto expected = mnist_params_of(none_dir / "ck/checkpoint_last.pt");
  auto check_params = [&](const std::string& checkpoint, const std::string& what) {
    const auto got = mnist_params_of(checkpoint);
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO(what << ", parameter " << i << ": max |difference| " << (got[i] - expected[i]).abs().max().item<double>());
      CHECK(torch::equal(got[i], expected[i]));
    }
  };
  check_params(full_dir / "ck/checkpoint_last.pt", "full, never stopped");
  for (const auto& [at, file] : std::vector<std::pair<int, std::string>>{
           {3, "checkpoint_1_3.pt"}, {5, "checkpoint_1_5.pt"}, {6, "checkpoint1.pt"}}) {
    TempDir resumed_dir;
    const auto resumed = run(resumed_dir.path(), "full", {"--restore-file", full_dir / ("ck/" + file)});
    require_all(resumed, "full resumed at update " + std::to_string(at));
    const auto lines = json_lines(resumed[0].out, "train");
    REQUIRE(!lines.empty());
    CHECK(lines.front()["num_updates"].get<int64_t>() == at + 1);
    check_params(resumed_dir / "ck/checkpoint_last.pt", "full resumed at update " + std::to_string(at));
  }
}

TEST_CASE("Sharding full: ranks resumed from different checkpoints of the same update stop at start, the check "
          "comparing digests of the parameters gathered unit by unit",
          "[distributed][multiprocess][zero_shard]") {
  // Two full runs that differ only in their initial weights (--seed) reach update 2; then ranks 0 and 1 resume
  // from the first run's checkpoint and rank 2 from the second's: the same position, other parameters. Under full
  // no rank holds the whole model, so the check compares each parameter's CRC (Note [Sharded parameters], "The
  // resume check"); every rank stops with the line naming the state.
  auto commands = [](const std::string& dir, const std::vector<std::string>& seeds,
                     const std::vector<std::string>& restore, const std::string& max_update) {
    const std::vector<std::string> batches{"16", "24", "40"}, budgets{"1", "1", "2"};
    std::vector<std::vector<std::string>> out;
    for (size_t r = 0; r < 3; ++r) {
      auto args = with(mnist_train_args(fashion_mnist_prefix(500, 100), dir + "/ck", std::stoi(seeds[r])),
                       {"--dropout", "0,0", "--disable-validation", "--max-update", max_update, "--max-sentences",
                        batches[r], "--zero-sharding", "full", "--memory-budget", budgets[r],
                        "--distributed-world-size", "3", "--distributed-rank", std::to_string(r),
                        "--distributed-init-method", "file://" + dir + "/rendezvous"});
      if (!restore.empty()) args = with(args, {"--restore-file", restore[r]});
      out.push_back(args);
    }
    return out;
  };
  TempDir a, b, mixed;
  require_all(run_processes(commands(a.path(), {"11", "11", "11"}, {}, "2"), 300s), "full, seed 11");
  require_all(run_processes(commands(b.path(), {"12", "12", "12"}, {}, "2"), 300s), "full, seed 12");
  const std::string mine = a / "ck/checkpoint_last.pt", other = b / "ck/checkpoint_last.pt";
  const auto ranks = run_processes(commands(mixed.path(), {"11", "11", "11"}, {mine, mine, other}, "4"), 300s);
  for (size_t r = 0; r < 3; ++r) {
    INFO("rank " << r << ":\n" << ranks[r].err);
    CHECK_FALSE(ranks[r].timed_out);
    CHECK(ranks[r].exit_code != 0);
    CHECK_THAT(ranks[r].err, Catch::Contains("the ranks disagree on the training state at start"));
  }
}

TEST_CASE("Sharding flags: bad values of --zero-sharding and --memory-budget, and a mismatch between ranks, are one "
          "line naming the flag",
          "[distributed][multiprocess][zero_shard]") {
  TempDir dir;
  const auto base = with(mnist_train_args(zero_sharding_data(), dir / "ck"),
                         {"--max-update", "1", "--disable-validation", "--max-sentences", "8", "--no-save"});
  const auto bad_mode = run_process(with(base, {"--zero-sharding", "all"}), 60s);
  CHECK(bad_mode.exit_code == hetseq::kExitUsage);
  CHECK_THAT(bad_mode.err, Catch::Contains("--zero-sharding: 'all' is not one of none, os, os+grad, full"));
  const auto hook = run_process(with(base, {"--zero-sharding", "os+grad", "--ddp-comm-hook", "fp16"}), 60s);
  CHECK(hook.exit_code == hetseq::kExitUsage);
  CHECK_THAT(hook.err, Catch::Contains("--zero-sharding os+grad: --ddp-comm-hook fp16 is not supported with it, use "
                                       "--ddp-comm-hook none"));
  const auto unused = run_process(with(base, {"--zero-sharding", "full", "--find-unused-parameters"}), 60s);
  CHECK(unused.exit_code == hetseq::kExitUsage);
  CHECK_THAT(unused.err, Catch::Contains("--zero-sharding full: --find-unused-parameters is not supported with it"));
  const auto bad_budget = run_process(with(base, {"--zero-sharding", "os", "--memory-budget", "-2"}), 60s);
  CHECK(bad_budget.exit_code == hetseq::kExitUsage);
  CHECK_THAT(bad_budget.err, Catch::Contains("--memory-budget: -2 must be a positive number of GB"));

  // The ranks must agree on --zero-sharding (a compared flag).
  std::vector<std::vector<std::string>> commands;
  for (int r = 0; r < 2; ++r) {
    commands.push_back(with(mnist_train_args(zero_sharding_data(), dir / "ck2"),
                            {"--max-update", "1", "--disable-validation", "--max-sentences", "8", "--zero-sharding",
                             r == 0 ? "os" : "none", "--distributed-world-size", "2", "--distributed-rank",
                             std::to_string(r), "--distributed-init-method", "file://" + (dir / "rendezvous")}));
  }
  const auto mismatch = run_processes(commands, 120s);
  CHECK(mismatch[0].exit_code == hetseq::kExitInput);
  CHECK(mismatch[1].exit_code == hetseq::kExitInput);
  CHECK_THAT(mismatch[0].err + mismatch[1].err, Catch::Contains("--zero-sharding"));
}

TEST_CASE("A sharded checkpoint (os, os+grad or full, budgets 1:1:2) resumes under other budgets, on 2 ranks (1:3), "
          "on 1 and under none, bit for bit",
          "[distributed][multiprocess][zero_shard]") {
  namespace fs = std::filesystem;
  TempDir straight, dir_os, dir_none, dir_grad, dir_full, os_two, grad_two, full_two, os_one, full_one;
  require_all(train(straight.path(), "none", {}, 20, true), "uninterrupted none");
  const auto expected = mnist_params_of(straight / "ck/checkpoint_last.pt");
  require_all(train(dir_os.path(), "os", {"1", "1", "2"}, 10, true), "os to 10");
  require_all(train(dir_grad.path(), "os+grad", {"1", "1", "2"}, 10, true), "os+grad to 10");
  require_all(train(dir_full.path(), "full", {"1", "1", "2"}, 10, true), "full to 10");
  // full's checkpoint holds the whole model, gathered unit by unit for rank 0's file: os's weights.
  const auto os_10 = mnist_params_of(dir_os / "ck/checkpoint_last.pt");
  const auto full_10 = mnist_params_of(dir_full / "ck/checkpoint_last.pt");
  for (size_t i = 0; i < os_10.size(); ++i) CHECK(torch::equal(full_10[i], os_10[i]));
  // The checkpoint keeps the optimizer's buffers in one shard file per rank (tests/shard/
  // test_sharded_checkpoint.cpp checks them); the file itself has the scalars. os+grad and full write the same.
  for (const auto* dir : {&dir_os, &dir_grad, &dir_full}) {
    const auto saved = hetseq::load_checkpoint(*dir / "ck/checkpoint_last.pt");
    REQUIRE(saved.optimizer_state.has_value());
    CHECK(saved.optimizer_state->count("param.0.exp_avg") == 0);
    REQUIRE(saved.optimizer_shards.has_value());
    CHECK(saved.optimizer_shards->world_size == 3);
  }
  fs::copy(dir_os / "ck", dir_none / "ck", fs::copy_options::recursive);
  fs::copy(dir_os / "ck", os_two / "ck", fs::copy_options::recursive);
  fs::copy(dir_grad / "ck", grad_two / "ck", fs::copy_options::recursive);
  fs::copy(dir_os / "ck", os_one / "ck", fs::copy_options::recursive);
  fs::copy(dir_full / "ck", full_two / "ck", fs::copy_options::recursive);
  fs::copy(dir_full / "ck", full_one / "ck", fs::copy_options::recursive);

  // On 3 ranks to update 20: os under budgets 3:1:1, and none: each the run that never stopped.
  const auto os = train(dir_os.path(), "os", {"3", "1", "1"}, 20, true);
  require_all(os, "resumed os 3:1:1");
  CHECK_THAT(os[0].err, Catch::Contains("resumed from"));
  require_all(train(dir_none.path(), "none", {}, 20, true), "resumed none");
  const auto a = mnist_params_of(dir_os / "ck/checkpoint_last.pt");
  const auto b = mnist_params_of(dir_none / "ck/checkpoint_last.pt");
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("parameter " << i << ": max |difference| os " << (a[i] - expected[i]).abs().max().item<double>()
                      << ", none " << (b[i] - expected[i]).abs().max().item<double>());
    CHECK(torch::equal(a[i], expected[i]));
    CHECK(torch::equal(b[i], expected[i]));
  }

  // On 2 ranks (batches 20, 29) to update 20: the os+grad checkpoint under os+grad with budgets 1:3, and the os
  // checkpoint (the same weights and state) under none: the same parameters.
  const auto grad = train(grad_two.path(), "os+grad", {"1", "3"}, 20, true, {}, {20, 29});
  require_all(grad, "os+grad checkpoint to 2 ranks, os+grad 1:3");
  CHECK_THAT(grad[0].err, Catch::Contains("resumed from"));
  require_all(train(os_two.path(), "none", {}, 20, true, {}, {20, 29}), "os checkpoint to 2 ranks, none");
  const auto resaved = hetseq::load_checkpoint(grad_two / "ck/checkpoint_last.pt");
  REQUIRE(resaved.optimizer_shards.has_value());
  CHECK(resaved.optimizer_shards->world_size == 2);
  const auto d = mnist_params_of(grad_two / "ck/checkpoint_last.pt");
  const auto e = mnist_params_of(os_two / "ck/checkpoint_last.pt");
  for (size_t i = 0; i < d.size(); ++i) {
    INFO("parameter " << i << ": max |difference| " << (d[i] - e[i]).abs().max().item<double>());
    CHECK(torch::equal(d[i], e[i]));
  }

  // The full checkpoint on 2 ranks under full with budgets 1:3, and on 1 rank under none (batch 49, the
  // samples of an update), as the os checkpoint there: the same parameters.
  const auto full = train(full_two.path(), "full", {"1", "3"}, 20, true, {}, {20, 29});
  require_all(full, "full checkpoint to 2 ranks, full 1:3");
  CHECK_THAT(full[0].err, Catch::Contains("resumed from"));
  const auto f = mnist_params_of(full_two / "ck/checkpoint_last.pt");
  require_all(train(full_one.path(), "none", {}, 20, true, {}, {49}), "full checkpoint to 1 rank, none");
  require_all(train(os_one.path(), "none", {}, 20, true, {}, {49}), "os checkpoint to 1 rank, none");
  const auto g = mnist_params_of(full_one / "ck/checkpoint_last.pt");
  const auto h = mnist_params_of(os_one / "ck/checkpoint_last.pt");
  for (size_t i = 0; i < f.size(); ++i) {
    INFO("parameter " << i << ": max |difference| 2 ranks " << (f[i] - e[i]).abs().max().item<double>()
                      << ", 1 rank " << (g[i] - h[i]).abs().max().item<double>());
    CHECK(torch::equal(f[i], e[i]));
    CHECK(torch::equal(g[i], h[i]));
  }
}

TEST_CASE("Sharding os, os+grad and full under --bf16 autocast, 2 micro-batches an update, train the parameters of "
          "none, bit for bit",
          "[distributed][multiprocess][zero_shard]") {
  // The parameters and the optimizer state stay float32 under autocast: sharding sees what it sees without it.
  // Under os+grad and full the first micro-batch's gradients accumulate in .grad, the second's backward sends
  // them; under full the units' bfloat16 copies that autocast makes are what backward reads.
  // 2 updates of batches 3, 5 and 8: bf16 on a CPU is slow (3 runs of 6 updates of 7, 13 and 29 took 48 s of the
  // suite).
  const std::vector<int> batches{3, 5, 8};
  const std::vector<std::string> more{"--bf16", "--update-freq", "2"};
  TempDir none_dir, os_dir, grad_dir, full_dir;
  require_all(train(none_dir.path(), "none", {}, 2, false, more, batches), "none --bf16");
  const auto os = train(os_dir.path(), "os", {"1", "1", "2"}, 2, false, more, batches);
  require_all(os, "os --bf16");
  CHECK_THAT(os[0].err, Catch::Contains("[bf16] bfloat16 forward passes"));
  CHECK(json_lines(os[0].out, "shard").size() == 3);
  require_all(train(grad_dir.path(), "os+grad", {"1", "1", "2"}, 2, false, more, batches), "os+grad --bf16");
  require_all(train(full_dir.path(), "full", {"1", "1", "2"}, 2, false, more, batches), "full --bf16");
  const auto expected = mnist_params_of(none_dir / "ck/checkpoint_last.pt");
  const auto got = mnist_params_of(os_dir / "ck/checkpoint_last.pt");
  const auto got_grad = mnist_params_of(grad_dir / "ck/checkpoint_last.pt");
  const auto got_full = mnist_params_of(full_dir / "ck/checkpoint_last.pt");
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("parameter " << i << ": max |difference| os " << (got[i] - expected[i]).abs().max().item<double>()
                      << ", os+grad " << (got_grad[i] - expected[i]).abs().max().item<double>() << ", full "
                      << (got_full[i] - expected[i]).abs().max().item<double>());
    CHECK(torch::equal(got[i], expected[i]));
    CHECK(torch::equal(got_grad[i], expected[i]));
    CHECK(torch::equal(got_full[i], expected[i]));
  }
}

TEST_CASE("Sharding full trains tiny BERT (its root: embeddings, tied decoder, pooler, dropout 0.1) as none, bit for "
          "bit, with unequal budgets, batches and update-freqs, an epoch's uneven end, and a resume before it",
          "[distributed][multiprocess][zero_shard][bert]") {
  // 80 sequences at 8 + 6 + 10 an update: update 4 ends epoch 1 with 8, all rank 0's, so ranks 1 and 2 run
  // stand-in passes (Note [Stand-in passes]), which must leave dropout's generators as they found them. BERT's
  // encoder layers are units; its embeddings, pooler and heads (the decoder tied to the word embeddings) are the
  // root, whole on every rank and gathered from their owners after each step (UnitGather::gather_root).
  TempDir data;
  write_shard(data / "toy_train_0.hdf5", make_shard(48, 16, 4));
  write_shard(data / "toy_train_1.hdf5", make_shard(32, 16, 4));
  write_shard(data / "toy_test_0.hdf5", make_shard(20, 16, 4));
  auto run = [&](const std::string& dir, const std::string& sharding, const std::vector<std::string>& more) {
    const std::vector<std::string> batches{"4", "6", "10"}, freqs{"2", "1", "1"}, budgets{"1", "1", "2"};
    std::vector<std::vector<std::string>> commands;
    for (size_t r = 0; r < 3; ++r) {
      auto args = std::vector<std::string>{
          binary_path("hetseq-train"), "--task", "bert", "--data", data.path(), "--config_file",
          source_dir() + "/configs/bert-tiny.json", "--cpu", "--intra-op-threads", "1", "--num-workers", "0",
          "--optimizer", "adam", "--lr", "0.002", "--weight-decay", "0.01", "--clip-norm", "1.0", "--max-update", "6",
          "--valid-subset", "test", "--log-format", "json", "--log-interval", "1", "--no-progress-bar", "--seed", "3",
          "--max-sentences", batches[r], "--update-freq", freqs[r], "--zero-sharding", sharding, "--save-dir",
          dir + "/ck", "--distributed-world-size", "3", "--distributed-rank", std::to_string(r),
          "--distributed-init-method", "file://" + dir + "/rendezvous"};
      if (sharding != "none") args = with(args, {"--memory-budget", budgets[r]});
      commands.push_back(with(args, more));
    }
    return run_processes(commands, 300s);
  };
  auto model_of = [](const std::string& path) { return hetseq::load_checkpoint(path).model; };
  auto check_same = [](const std::vector<std::pair<std::string, torch::Tensor>>& expected,
                       const std::vector<std::pair<std::string, torch::Tensor>>& got, const std::string& what) {
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO(what << ", " << expected[i].first << ": max |difference| "
                << (got[i].second - expected[i].second).abs().max().item<double>());
      CHECK(got[i].first == expected[i].first);
      CHECK(torch::equal(got[i].second, expected[i].second));
    }
  };
  TempDir none_dir, full_dir, resumed_dir;
  const auto none = run(none_dir.path(), "none", {});
  require_all(none, "none");
  const auto full = run(full_dir.path(), "full", {"--save-interval-updates", "3"});
  require_all(full, "full");
  const auto expected = model_of(none_dir / "ck/checkpoint_last.pt");
  check_same(expected, model_of(full_dir / "ck/checkpoint_last.pt"), "full, never stopped");
  const auto none_valid = json_lines(none[0].out, "valid"), full_valid = json_lines(full[0].out, "valid");
  REQUIRE(!none_valid.empty());
  CHECK(full_valid.back()["loss"].get<double>() == none_valid.back()["loss"].get<double>());
  // Resumed at update 3, the update before the short end: the new process's second update has ranks without
  // samples, and it has trained nothing of its own before it.
  const auto resumed = run(resumed_dir.path(), "full", {"--restore-file", full_dir / "ck/checkpoint_1_3.pt"});
  require_all(resumed, "full resumed at update 3");
  check_same(expected, model_of(resumed_dir / "ck/checkpoint_last.pt"), "full, resumed at update 3");
}

TEST_CASE("Sharding full: stand-in passes leave a unit's BatchNorm statistics and dropout's generator as they were, "
          "so a model of BatchNorm and dropout units trains as under none, bit for bit",
          "[distributed][multiprocess][zero_shard][test-plugin]") {
  // 100 points at 8 + 6 + 10 an update (batches 4/6/10, update-freqs 2/1/1): ranks 1 and 2 run a stand-in pass
  // in every update (they have 1 micro-batch where rank 0 has 2), and update 5 ends the epoch with 4 points,
  // all rank 0's. A stand-in in train mode moves the BatchNorms' running statistics and num_batches_tracked and
  // draws dropout masks: unless it puts them back, the buffers and the later draws differ from none's.
  const std::string plugin = binary_dir() + "/test-plugins/libbn_units_task.so";
  auto run = [&](const std::string& dir, const std::string& sharding) {
    const std::vector<std::string> batches{"4", "6", "10"}, freqs{"2", "1", "1"}, budgets{"1", "1", "2"};
    std::vector<std::vector<std::string>> commands;
    for (size_t r = 0; r < 3; ++r) {
      auto args = std::vector<std::string>{
          binary_path("hetseq-train"), "--user-dir", plugin, "--task", "bn_units", "--cpu", "--intra-op-threads", "1",
          "--num-workers", "0", "--max-update", "8", "--valid-subset", "test", "--log-format", "json",
          "--no-progress-bar", "--seed", "5", "--max-sentences", batches[r], "--update-freq", freqs[r],
          "--zero-sharding", sharding, "--save-dir", dir + "/ck", "--distributed-world-size", "3",
          "--distributed-rank", std::to_string(r), "--distributed-init-method", "file://" + dir + "/rendezvous"};
      if (sharding != "none") args = with(args, {"--memory-budget", budgets[r]});
      commands.push_back(args);
    }
    return run_processes(commands, 300s);
  };
  TempDir none_dir, full_dir;
  const auto none = run(none_dir.path(), "none");
  require_all(none, "none");
  const auto full = run(full_dir.path(), "full");
  require_all(full, "full");
  const auto expected = hetseq::load_checkpoint(none_dir / "ck/checkpoint_last.pt").model;
  const auto got = hetseq::load_checkpoint(full_dir / "ck/checkpoint_last.pt").model;
  REQUIRE(got.size() == expected.size());
  bool saw_running_mean = false;
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO(expected[i].first << ": max |difference| "
                           << (got[i].second.to(torch::kDouble) - expected[i].second.to(torch::kDouble)).abs().max().item<double>());
    CHECK(got[i].first == expected[i].first);
    CHECK(torch::equal(got[i].second, expected[i].second));
    saw_running_mean = saw_running_mean || expected[i].first.find("running_mean") != std::string::npos;
  }
  CHECK(saw_running_mean);
  const auto none_valid = json_lines(none[0].out, "valid"), full_valid = json_lines(full[0].out, "valid");
  REQUIRE(!none_valid.empty());
  REQUIRE(full_valid.size() == none_valid.size());
  CHECK(full_valid.back()["loss"].get<double>() == none_valid.back()["loss"].get<double>());
}

TEST_CASE("Sharding os+grad and full: a parameter that gets a gradient on some ranks only (a branch the data "
          "decides) trains as none with --find-unused-parameters, bit for bit",
          "[distributed][multiprocess][zero_shard][test-plugin]") {
  // The branch_units task adds its `extra` layer only for a batch whose first point has a positive first
  // coordinate: in an update some ranks give branch.extra a gradient and others none. Batches 4/6/10,
  // update-freqs 2/1/1 (rank 0 runs two passes an update: the unit a branch left gathered must not skip the
  // next pass's gather, Note [Sharded parameters], "A branch"), plain SGD, whose step moves exactly by the gradient.
  const std::string plugin = binary_dir() + "/test-plugins/libbranch_units_task.so";
  auto run = [&](const std::string& dir, const std::string& sharding, const std::vector<std::string>& more) {
    const std::vector<std::string> batches{"4", "6", "10"}, freqs{"2", "1", "1"}, budgets{"1", "1", "2"};
    std::vector<std::vector<std::string>> commands;
    for (size_t r = 0; r < 3; ++r) {
      auto args = std::vector<std::string>{
          binary_path("hetseq-train"), "--user-dir", plugin, "--task", "branch_units", "--cpu", "--intra-op-threads",
          "1", "--num-workers", "0", "--max-update", "8", "--valid-subset", "test", "--log-format", "json",
          "--no-progress-bar", "--seed", "5", "--max-sentences", batches[r], "--update-freq", freqs[r],
          "--zero-sharding", sharding, "--save-dir", dir + "/ck", "--distributed-world-size", "3",
          "--distributed-timeout", "30", "--distributed-rank", std::to_string(r),
          "--distributed-init-method", "file://" + dir + "/rendezvous"};
      if (sharding != "none") args = with(args, {"--memory-budget", budgets[r]});
      commands.push_back(with(args, more));
    }
    return run_processes(commands, 300s);
  };
  // The task does take the branch on some ranks only: none without the flag stops, naming the parameters.
  TempDir plain_dir;
  const auto plain = run(plain_dir.path(), "none", {});
  bool named = false;
  for (const auto& r : plain) named = named || r.err.find("parameters without any gradient: [branch.extra.weight, "
                                                          "branch.extra.bias]") != std::string::npos;
  CHECK(named);
  TempDir none_dir;
  const auto none = run(none_dir.path(), "none", {"--find-unused-parameters"});
  require_all(none, "none with --find-unused-parameters");
  const auto expected = hetseq::load_checkpoint(none_dir / "ck/checkpoint_last.pt").model;
  for (const std::string sharding : {"os+grad", "full"}) {
    CAPTURE(sharding);
    TempDir dir;
    const auto ranks = run(dir.path(), sharding, {});
    require_all(ranks, sharding);
    const auto got = hetseq::load_checkpoint(dir / "ck/checkpoint_last.pt").model;
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO(expected[i].first);
      CHECK(got[i].first == expected[i].first);
      CHECK(torch::equal(got[i].second, expected[i].second));
    }
    CHECK(json_lines(ranks[0].out, "valid").back()["loss"].get<double>() ==
          json_lines(none[0].out, "valid").back()["loss"].get<double>());
  }
}
