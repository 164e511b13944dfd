// Level 2: hetseq-train under torchrun (the elastic agent of the pinned torch wheel): its agent's
// store, restarts after a killed worker, and a world that shrinks when an agent dies. See Note
// [Joining a world] and Note [Rendezvous keys].
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <regex>
#include <thread>

#include <catch2/catch.hpp>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "support/mnist_files.h"
#include "support/run_output.h"
#include "support/process_checks.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

using namespace hetseq;
using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// torchrun of the venv whose torch wheel LibTorch came from (scripts/setup.sh).
std::string torchrun() {
  const std::string python = python_path();
  REQUIRE(!python.empty());
  const std::string path = std::filesystem::path(python).parent_path() / "torchrun";
  REQUIRE(std::filesystem::exists(path));
  return path;
}

std::vector<std::string> train_args(const std::string& data, const std::string& save_dir, const std::string& ids) {
  return {binary_path("hetseq-train"), "--task", "mnist", "--data", data, "--cpu", "--optimizer", "adam", "--lr",
          "0.001", "--num-workers", "0", "--intra-op-threads", "1", "--no-progress-bar", "--log-format", "json",
          "--log-interval", "1", "--save-dir", save_dir, "--distributed-timeout", "20", "--seed", "11",
          "--max-sentences", "8", "--max-epoch", "1", "--save-interval-updates", "1", "--keep-interval-updates", "2",
          "--disable-validation", "--dump-sample-ids", ids};
}

sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// A port the kernel says is free now (the agents' rendezvous endpoint must be given up front).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = loopback(0);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Whether something accepts connections on 127.0.0.1:`port`, waiting up to `patience` for it.
bool listening(int port, std::chrono::seconds patience) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  do {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = loopback(port);
    const bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (connected) return true;
    std::this_thread::sleep_for(50ms);
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

// The environment of process `pid` as a map (empty when it is gone).
std::map<std::string, std::string> environment_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::map<std::string, std::string> env;
  std::string entry;
  while (std::getline(in, entry, '\0')) {
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

// The pid of the hetseq-train worker with RANK `rank` (any rank when negative) whose environment
// carries HETSEQ_TEST_MARK=`mark`, or -1.
int worker_pid(const std::string& mark, int rank) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (cmdline.find("hetseq-train") == std::string::npos) continue;
    auto env = environment_of(std::stoi(name));
    if (env["HETSEQ_TEST_MARK"] == mark && (rank < 0 || env["RANK"] == std::to_string(rank))) {
      return std::stoi(name);
    }
  }
  return -1;
}

size_t lines_in(const std::string& path) {
  std::ifstream in(path);
  return static_cast<size_t>(std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n'));
}

// The samples of epoch 1 that the finished run used: for each update, the ids of the last attempt
// that ran it (a killed attempt's updates after its last checkpoint were run again). Checks that a
// rerun update used the same samples as before.
std::vector<int64_t> samples_used(const std::string& ids, int ranks_before, int64_t resumed_at, int ranks_after) {
  std::map<std::pair<int, int64_t>, std::vector<int64_t>> last;  // [(rank, update)] ids of its last run
  for (int r = 0; r < std::max(ranks_before, ranks_after); ++r) {
    for (const auto& line : read_sample_ids(ids, r).value_or(std::vector<SampleIdLine>{})) {
      REQUIRE(line.epoch == 1);
      auto key = std::make_pair(r, line.update);
      if (last.count(key) && ranks_before == ranks_after) CHECK(last[key] == line.ids);  // replayed exactly
      last[key] = line.ids;
    }
  }
  std::vector<int64_t> used;
  for (const auto& [key, line] : last) {
    const bool before = key.second <= resumed_at;
    if ((before && key.first < ranks_before) || (!before && key.first < ranks_after)) {
      used.insert(used.end(), line.begin(), line.end());
    }
  }
  std::sort(used.begin(), used.end());
  return used;
}

// The updates done when the restarted workers resumed, from their "resumed from" line.
int64_t resumed_at(const std::string& output) {
  std::smatch m;
  REQUIRE(std::regex_search(output, m, std::regex("resumed from [^:]*checkpoint_last\\.pt: ([0-9]+) updates done")));
  return std::stoll(m[1]);
}

std::vector<int64_t> iota_of(int64_t n) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

}  // namespace

TEST_CASE("torchrun: two workers train with the agent's store", "[cluster][torchrun]") {
  TempDir dir;
  write_random_mnist(dir.path(), 160, 16);
  const auto r = run_process(with({torchrun(), "--standalone", "--nproc-per-node", "2", "--no-python"},
                                 train_args(dir.path(), dir / "save", dir / "ids")),
                             300s);
  INFO(r.out << r.err);
  REQUIRE(!r.timed_out);
  CHECK(r.exit_code == 0);
  const std::string all = r.out + r.err;
  CHECK_THAT(all, Contains("rank 0 of 2 joined via env://") && Contains("16 samples per update over 2 rank(s)"));
  CHECK_THAT(all, !Contains("failed to bind") && !Contains("store listening"));  // rank 0 hosts nothing
  CHECK(load_checkpoint(dir / "save/checkpoint_last.pt").num_updates == 10);  // 160 samples, 16 per update
  CHECK(samples_used(dir / "ids", 2, 0, 2) == iota_of(160));
}

TEST_CASE("torchrun restarts the workers after one is killed, and they resume exactly", "[cluster][torchrun]") {
  TempDir dir;
  write_random_mnist(dir.path(), 480, 16);  // 30 updates of 16
  const auto straight = run_process(with({torchrun(), "--standalone", "--nproc-per-node", "2", "--no-python"},
                                        train_args(dir.path(), dir / "straight", dir / "straight-ids")),
                                    300s);
  INFO(straight.err);
  REQUIRE(straight.exit_code == 0);

  const std::string mark = "restart-" + std::to_string(::getpid());
  Process run(with({torchrun(), "--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--no-python"},
                  train_args(dir.path(), dir / "killed", dir / "killed-ids")),
              {{"HETSEQ_TEST_MARK", mark}});
  // Kill rank 1 once it has logged 7 updates.
  const auto deadline = std::chrono::steady_clock::now() + 240s;
  while (lines_in(dir / "killed-ids/samples-rank1.txt") < 7 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  const int victim = worker_pid(mark, 1);
  REQUIRE(victim > 0);
  ::kill(victim, SIGKILL);
  const ProcessResult r = run.wait(400s);
  const std::string all = r.out + r.err;
  INFO(all);
  REQUIRE(!r.timed_out);
  CHECK(r.exit_code == 0);
  const int64_t resumed = resumed_at(all);
  CHECK(resumed >= 6);
  check_same_training_state(load_checkpoint(dir / "straight/checkpoint_last.pt"),
                            load_checkpoint(dir / "killed/checkpoint_last.pt"));
  CHECK(samples_used(dir / "killed-ids", 2, resumed, 2) == iota_of(480));
}

TEST_CASE("torchrun elastic: when one of two agents dies, its worker dies with it and the other agent finishes alone",
          "[cluster][torchrun]") {
  TempDir dir;
  write_random_mnist(dir.path(), 800, 16);  // 50 updates of 16 on two workers, 100 of 8 on one
  const int port = free_port();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  auto agent = [&]() {
    return with({torchrun(), "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 endpoint, "--rdzv-id", "elastic-" + std::to_string(::getpid()), "--rdzv-conf",
                 "last_call_timeout=8,join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3", "--max-restarts", "3", "--monitor-interval", "0.5",
                 "--no-python"},
                train_args(dir.path(), dir / "save", dir / "ids"));
  };
  // Both agents join the first round (it waits last_call_timeout after the first): a world of 2. The next
  // round waits until the dead agent's heartbeat is 3 intervals of 1 s old (torchrun's default, 3 of 5 s,
  // took 15 s of this test's 33).
  Process first(agent());
  // The first agent must host the rendezvous store: the one that dies cannot take it along.
  REQUIRE(listening(port, 60s));
  const std::string mark = "elastic-b-" + std::to_string(::getpid());
  Process second(agent(), {{"HETSEQ_TEST_MARK", mark}});
  const auto deadline = std::chrono::steady_clock::now() + 240s;
  while ((lines_in(dir / "ids/samples-rank0.txt") < 8 || lines_in(dir / "ids/samples-rank1.txt") < 8) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  const int orphan = worker_pid(mark, -1);
  REQUIRE(orphan > 0);
  // The second agent alone, as when its node dies: torchrun starts workers in a session of their own,
  // so this does not reach the worker, which must die with its agent (stop_request::die_with_launcher).
  second.kill();
  second.wait(30s);
  const auto orphan_deadline = std::chrono::steady_clock::now() + 10s;
  while (process_alive(orphan) && std::chrono::steady_clock::now() < orphan_deadline) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(!process_alive(orphan));
  if (process_alive(orphan)) ::kill(orphan, SIGKILL);
  const ProcessResult r = first.wait(300s);
  const std::string all = r.out + r.err;
  INFO(all);
  REQUIRE(!r.timed_out);
  CHECK(r.exit_code == 0);
  const int64_t resumed = resumed_at(all);
  CHECK(resumed >= 7);
  CHECK_THAT(all, Contains("the data plan changed") && Contains("rank 0 of 1 joined via env://"));
  const Checkpoint last = load_checkpoint(dir / "save/checkpoint_last.pt");
  CHECK(last.data_plan.batch_sizes == std::vector<int64_t>{8});
  CHECK(last.num_updates == resumed + (800 - 16 * resumed) / 8);  // the rest of the epoch, 8 at a time
  CHECK(samples_used(dir / "ids", 2, resumed, 1) == iota_of(800));
}
