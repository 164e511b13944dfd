// The default of --memory-budget under --zero-sharding os (Note [Room in a cgroup]), with real processes:
// a rank put into a memory cgroup of its own (cgroup v1's memory controller, /sys/fs/cgroup/memory, which a
// job scheduler would set) trains with the room that group leaves as its budget, not the machine's free
// memory, and the run trains.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <catch2/catch.hpp>

#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/subprocess.h"

using namespace hetseq::test;
using namespace std::chrono_literals;

namespace {

// The budget in MB that rank 0's "[memory] rank R: needs X MB of its Y MB" line gives rank `rank`.
std::optional<double> budget_mb_of(const std::string& err, int rank) {
  const std::regex line("\\[memory\\] rank " + std::to_string(rank) + ": needs [0-9.]+ MB of its ([0-9.]+) MB");
  std::smatch m;
  if (!std::regex_search(err, m, line)) return std::nullopt;
  return std::stod(m[1]);
}

// MemAvailable of /proc/meminfo, in MB.
double mem_available_mb() {
  std::ifstream meminfo("/proc/meminfo");
  std::string name, unit;
  double kb = 0;
  while (meminfo >> name >> kb >> unit && name != "MemAvailable:") {
  }
  return kb * 1024 / 1e6;
}

}  // namespace

TEST_CASE("The memory budget of --zero-sharding os without --memory-budget: a rank in a memory cgroup gets the room its group leaves as "
          "its budget, and the run trains",
          "[zero_shard][memory][multiprocess]") {
  const std::filesystem::path memory_root = "/sys/fs/cgroup/memory";
  const std::filesystem::path group = memory_root / ("hetseq-test-budget-" + std::to_string(::getpid()));
  std::error_code ec;
  if (!std::filesystem::create_directory(group, ec)) {
    WARN("no writable cgroup v1 memory controller at " << memory_root.string()
                                                       << ": the budget from a cgroup's room is not checked here");
    return;
  }
  struct RemoveGroup {
    std::filesystem::path dir;
    ~RemoveGroup() { ::rmdir(dir.c_str()); }
  } remove{group};
  constexpr int64_t kLimit = int64_t{2} << 30;  // 2 GiB: room for LibTorch and MNIST, far below this machine's RAM
  std::ofstream(group / "memory.limit_in_bytes") << kLimit;

  TempDir dir;
  write_random_mnist(dir.path(), 200, 10);
  std::vector<std::vector<std::string>> commands;
  for (int r = 0; r < 2; ++r) {
    commands.push_back(with(mnist_train_args(dir.path(), dir / "save"),
                            {"--max-sentences", "16", "--max-update", "3", "--disable-validation", "--zero-sharding",
                             "os", "--distributed-world-size", "2", "--distributed-rank", std::to_string(r),
                             "--distributed-init-method", "file://" + (dir / "rendezvous")}));
  }
  // Rank 1 joins the group before it execs hetseq-train.
  std::vector<std::string> in_group{"/bin/bash", "-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"", group.string()};
  commands[1].insert(commands[1].begin(), in_group.begin(), in_group.end());
  const auto ranks = run_processes(commands, 180s);
  require_all(ranks, "zero-sharding os with a cgroup");
  INFO("rank 0 stderr:\n" << ranks[0].err);
  const auto mine = budget_mb_of(ranks[0].err, 0), grouped = budget_mb_of(ranks[0].err, 1);
  REQUIRE(mine);
  REQUIRE(grouped);
  CHECK(*grouped > 0);
  CHECK(*grouped <= static_cast<double>(kLimit) / 1e6);
  // Rank 0, outside the group, gets the machine's free memory: far more, where the machine has it.
  if (mem_available_mb() > 3 * static_cast<double>(kLimit) / 1e6) CHECK(*mine > 1.5 * static_cast<double>(kLimit) / 1e6);
}
