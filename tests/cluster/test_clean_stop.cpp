// Level 2: hetseq-train as a cluster job sees it. SIGTERM to the launcher (scancel, preemption),
// workers dying with their launcher, typed exit codes, a rank started twice,. See Note [Clean stops] and
// Note [Rendezvous keys]; the checkpoint fence is tested in tests/world/test_rendezvous_keys.cpp (threads)
// and tests/cluster/test_slow_save.cpp (processes, a frozen filesystem).
#include <dirent.h>
#include <signal.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/core/error.h"
#include "hetseq/world/launcher.h"
#include "support/mnist_files.h"
#include "support/run_output.h"
#include "support/process_checks.h"
#include "support/subprocess.h"

using namespace hetseq;
using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// The pids of live processes whose command line contains `marker` (a test's unique directory).
std::vector<int> processes_with(const std::string& marker) {
  std::vector<int> pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* e = ::readdir(proc)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == ::getpid()) continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(marker) != std::string::npos && process_alive(pid)) pids.push_back(pid);
  }
  ::closedir(proc);
  return pids;
}

// Waits up to `deadline` for no live process to carry `marker`; returns the ones left.
std::vector<int> wait_gone(const std::string& marker, std::chrono::seconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::vector<int> left = processes_with(marker);
  while (!left.empty() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(100ms);
    left = processes_with(marker);
  }
  for (int pid : left) ::kill(pid, SIGKILL);  // never leave stragglers behind a failed test
  return left;
}

}  // namespace

TEST_CASE("SIGTERM to the launcher: the workers finish their update, rank 0 saves, all exit 'stopped', and the "
          "rerun continues exactly",
          "[cluster][signal]") {
  TempDir dir;
  write_random_mnist(dir.path(), 480, 40);
  // The case that used to leave orphans: two workers of one node over file://.
  auto node = [&](const std::string& name) {
    return with(mnist_train_args(dir.path(), dir / name),
                {"--max-sentences", "8,12", "--distributed-gpus", "2", "--distributed-world-size", "2",
                 "--distributed-init-method", "file://" + (dir / ("rdv-" + name)), "--max-epoch", "2",
                 "--save-interval-updates", "1", "--keep-interval-updates", "2", "--disable-validation",
                 "--dump-sample-ids", dir / (name + "-ids")});
  };
  const auto straight = run_process(node("straight"), 600s);
  require_success(straight, "uninterrupted run");

  // The real program, whose command line carries the marker that processes_with() looks for.
  Process run(node("stopped"), {{kTestStartEnv, "exec"}});
  REQUIRE(run.wait_for_err("4 updates)", 300s));  // checkpoint_1_4.pt saved: well inside epoch 1
  ::kill(run.pid(), SIGTERM);
  const auto signalled = std::chrono::steady_clock::now();
  // The workers share the launcher's process group: look for them before anything kills the group.
  const ProcessResult stopped = run.wait_leaving_group(120s);
  const std::vector<int> left = processes_with(dir / "stopped");
  const auto took = std::chrono::steady_clock::now() - signalled;
  INFO("stopped run stderr:\n" << stopped.err);
  CHECK(took < 30s);
  CHECK(stopped.exit_code == kExitStopped);
  CHECK(left.empty());  // no worker outlives its launcher: it waited for both
  CHECK(wait_gone(dir / "stopped", 1s).empty());
  // Every worker stopped; none failed.
  for (int worker = 0; worker < 2; ++worker) {
    CHECK_THAT(stopped.err, Contains(fmt::format("[launcher] rank {} (worker {}, pid ", worker, worker)));
    CHECK(std::regex_search(stopped.err, std::regex(fmt::format("\\[launcher\\] rank {} \\(worker {}, pid [0-9]+\\) "
                                                                "exited with code {}",
                                                                worker, worker, static_cast<int>(kExitStopped)))));
  }
  CHECK_THAT(stopped.err, !Contains("failed with exit code"));
  std::smatch m;
  REQUIRE(std::regex_search(stopped.err, m, std::regex("stopping after update ([0-9]+), epoch 1")));
  const int64_t last = std::stoll(m[1]);
  CHECK_THAT(stopped.err, Contains("SIGTERM received: asking the 2 worker(s) to stop") &&
                              Contains("run the same command again to continue from checkpoint_last.pt (exit code 5)"));
  const Checkpoint saved = load_checkpoint(dir / "stopped/checkpoint_last.pt");
  CHECK(saved.num_updates == last);
  CHECK(last < 48);  // stopped inside the run: 2 epochs of 24 updates

  const auto resumed = run_process(node("stopped"), 600s);
  require_success(resumed, "rerun");
  CHECK_THAT(resumed.err, Contains("resumed from") && Contains(std::to_string(last) + " updates done"));
  check_same_training_state(load_checkpoint(dir / "straight/checkpoint_last.pt"),
                            load_checkpoint(dir / "stopped/checkpoint_last.pt"));
  // Every sample of each epoch once over both ranks, across the stop.
  for (int64_t epoch : {1, 2}) {
    std::vector<int64_t> used;
    for (int r = 0; r < 2; ++r) {
      for (const auto& line : read_sample_ids(dir / "stopped-ids", r).value_or(std::vector<SampleIdLine>{})) {
        if (line.epoch == epoch) used.insert(used.end(), line.ids.begin(), line.ids.end());
      }
    }
    std::sort(used.begin(), used.end());
    std::vector<int64_t> all(480);
    std::iota(all.begin(), all.end(), 0);
    CHECK(used == all);
  }
}

TEST_CASE("workers die with their launcher, forked or started anew", "[cluster][signal]") {
  TempDir dir;
  write_random_mnist(dir.path(), 960, 40);
  // The launcher is the real program (its command line carries the marker); its workers are its forks
  // (Note [Forked workers]) or new starts of it, and both carry the marker too.
  for (const std::string start : {"fork", "exec"}) {
    DYNAMIC_SECTION(start) {
      std::map<std::string, std::string> env{{kTestStartEnv, "exec"}};
      if (start == "exec") env[kWorkerStartEnv] = "exec";
      Process run(with(mnist_train_args(dir.path(), dir / ("save-" + start)),
                       {"--max-sentences", "8", "--distributed-gpus", "2", "--distributed-init-method",
                        "file://" + (dir / ("rdv-" + start)), "--max-epoch", "50", "--disable-validation", "--no-save"}),
                  env);
      REQUIRE(run.wait_for_err("[train] 960 training samples", 120s));
      CHECK_THAT(run.err_so_far(), Contains(start == "fork" ? "(forked)" : "(fork+exec)"));
      REQUIRE(processes_with(dir / ("save-" + start)).size() == 3);  // the launcher and its two workers
      ::kill(run.pid(), SIGKILL);  // the launcher only (the OOM killer, a lost node's agent)
      CHECK(wait_gone(dir / ("save-" + start), 10s).empty());
    }
  }
}

TEST_CASE("two workers started with the same rank fail at once, naming both", "[cluster][rendezvous]") {
  TempDir dir;
  write_random_mnist(dir.path(), 200, 40);
  auto rank = [&](int r) {
    return with(mnist_train_args(dir.path(), dir / "save"),
                {"--max-sentences", "8", "--distributed-world-size", "3", "--distributed-rank", std::to_string(r),
                 "--distributed-init-method", "file://" + (dir / "rdv"), "--max-update", "3", "--disable-validation",
                 "--rendezvous-timeout", "200", "--log-all-ranks"});
  };
  const auto start = std::chrono::steady_clock::now();
  Process zero(rank(0));
  Process first(rank(1));
  REQUIRE(first.wait_for_err("rank 1 of 3 joined", 60s));
  Process second(rank(1));
  const ProcessResult results[] = {zero.wait(120s), first.wait(120s), second.wait(120s)};
  CHECK(std::chrono::steady_clock::now() - start < 60s);  // not the rendezvous timeout: at once
  const std::regex both("two workers were started as rank 1: host [^ ]+ pid ([0-9]+) and host [^ ]+ pid ([0-9]+); "
                        "give every worker its own --distributed-rank");
  for (const auto& r : results) {
    INFO(r.err);
    CHECK(!r.timed_out);
    CHECK(r.exit_code == kExitInput);
    std::smatch m;
    REQUIRE(std::regex_search(r.err, m, both));
    CHECK(std::stoi(m[1]) == first.pid());
    CHECK(std::stoi(m[2]) == second.pid());
  }
}
