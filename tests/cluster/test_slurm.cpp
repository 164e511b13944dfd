// hetseq-train under a real Slurm: tests/cluster/local_slurm.sh runs a two-node cluster on this machine
// (munged, slurmctld, a slurmd for `localhost` and one for `node2`), srun starts the workers with
// no distributed flag, and scripts/slurm/hetseq.sbatch runs as a user would submit it. Needs root
// and Debian's slurm-wlm (scripts/setup.sh): a cluster that does not start fails the test.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "hetseq/core/format.h"
#include "support/mnist_files.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

using namespace hetseq::test;
using namespace std::chrono_literals;

// Its helpers and tests in a namespace of their own: the unity batch of tests/cluster/ has other free_port()s.
namespace slurm_test {

const std::string kLocalSlurm = source_dir() + "/tests/cluster/local_slurm.sh";
const std::string kBatchScript = source_dir() + "/scripts/slurm/hetseq.sbatch";

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A TCP port that is free now, as the kernel picks it for port 0: the rendezvous of a multi-node
// world needs a port known in advance (MASTER_PORT).
std::string free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
  ::close(fd);
  REQUIRE(ok);
  return std::to_string(ntohs(addr.sin_port));
}

// The cluster of tests/cluster/local_slurm.sh, stopped (daemons and leftover jobs) on destruction.
class LocalSlurm {
 public:
  LocalSlurm() : start_(run_process({"/bin/bash", kLocalSlurm, "start", dir_.path()}, 120s)) {}
  ~LocalSlurm() { run_process({"/bin/bash", kLocalSlurm, "stop", dir_.path()}, 120s); }
  LocalSlurm(const LocalSlurm&) = delete;
  LocalSlurm& operator=(const LocalSlurm&) = delete;

  /// Whether the cluster came up; its start's output otherwise.
  bool started() const { return start_.exit_code == 0; }
  std::string start_output() const { return start_.out + start_.err; }
  /// The environment of a Slurm client (srun, sbatch) of this cluster.
  std::map<std::string, std::string> client_env() const { return {{"SLURM_CONF", dir_ / "slurm.conf"}}; }

 private:
  TempDir dir_;
  ProcessResult start_;
};

// The flags of a small MNIST run on the CPU: `samples` images, one epoch, no validation.
std::vector<std::string> mnist_flags(const std::string& data, const std::string& save_dir, int64_t batch) {
  return {"--task", "mnist", "--data", data, "--cpu", "--optimizer", "adam", "--lr", "0.001", "--max-sentences",
          std::to_string(batch), "--max-epoch", "1", "--disable-validation", "--num-workers", "0",
          "--intra-op-threads", "1", "--no-progress-bar", "--log-format", "json", "--log-interval", "1",
          "--save-dir", save_dir, "--distributed-timeout", "60"};
}

// Checks that `out` and `err` (all ranks' output) hold one model's training: one log (rank 0's),
// `ranks` ranks, `updates` updates in the one epoch, one checkpoint.
void check_one_model(const std::string& out, const std::string& err, int ranks, int64_t updates,
                     const std::string& save_dir) {
  CHECK(count_of(err, fmt::format("[train] 320 training samples, 64 samples per update over {} rank(s), {} updates "
                                  "per epoch",
                                  ranks, updates)) == 1);
  CHECK(count_of(err, fmt::format("[rendezvous] rank 0 of {} joined", ranks)) == 1);
  CHECK(count_of(err, "[train] done") == 1);
  CHECK(count_of(err, "[checkpoint] saved ") == 1);
  const auto epochs = json_lines(out, "train_epoch");
  REQUIRE(epochs.size() == 1);
  CHECK(epochs[0].value("num_updates", int64_t{-1}) == updates);
  CHECK(json_lines(out, "train").size() == static_cast<size_t>(updates));
  CHECK(std::filesystem::exists(save_dir + "/checkpoint_last.pt"));
}



TEST_CASE("Slurm: srun --ntasks 2 trains one model with one worker per task and no distributed flag",
          "[slurm][multiprocess]") {
  LocalSlurm slurm;
  INFO(slurm.start_output());
  REQUIRE(slurm.started());
  TempDir data, work;
  write_random_mnist(data.path(), 320, 32);
  auto env = slurm.client_env();
  env["MASTER_PORT"] = free_port();

  SECTION("two tasks on one node: ranks SLURM_PROCID of SLURM_NTASKS, nothing spawned") {
    std::vector<std::string> argv{"/usr/bin/srun", "--nodes", "1", "--ntasks", "2", "--cpus-per-task", "1", "--time",
                                  "5", "--kill-on-bad-exit=1", binary_path("hetseq-train")};
    for (const auto& f : mnist_flags(data.path(), work / "save", 32)) argv.push_back(f);
    const auto r = run_process(argv, 300s, env);
    INFO("srun stderr:\n" << r.err);
    REQUIRE_FALSE(r.timed_out);
    REQUIRE(r.exit_code == 0);
    // 320 samples, 2 ranks x 32 per update: 5 updates.
    check_one_model(r.out, r.err, 2, 5, work / "save");
    CHECK(count_of(r.err, "[train] rank 1 on ") == 1);
    CHECK(count_of(r.err, "[launcher]") == 0);  // each task is one worker
  }

  SECTION("asking each of several tasks on a node to spawn workers stops with the Slurm variable named") {
    std::vector<std::string> argv{"/usr/bin/srun", "--nodes", "1", "--ntasks", "2", "--cpus-per-task", "1", "--time",
                                  "5", binary_path("hetseq-train")};
    for (const auto& f : mnist_flags(data.path(), work / "save", 32)) argv.push_back(f);
    argv.insert(argv.end(), {"--distributed-gpus", "2"});
    const auto r = run_process(argv, 300s, env);
    INFO("srun stderr:\n" << r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.exit_code == 2);
    CHECK(count_of(r.err, "--distributed-gpus 2: Slurm runs several tasks on a node (SLURM_STEP_TASKS_PER_NODE=2)") ==
          2);
    CHECK(count_of(r.err, "[train]") == 0);
  }
}

TEST_CASE("Slurm: scripts/slurm/hetseq.sbatch on two nodes with one task per node spawning 2 workers trains one model",
          "[slurm][multiprocess]") {
  LocalSlurm slurm;
  INFO(slurm.start_output());
  REQUIRE(slurm.started());
  TempDir data, work;
  write_random_mnist(data.path(), 320, 32);
  auto env = slurm.client_env();
  env["HETSEQ_TRAIN"] = binary_path("hetseq-train");
  const std::string port = free_port();
  env["MASTER_PORT"] = port;
  // The script as a user submits it: its #SBATCH lines say 2 nodes with 4 GPUs each; these nodes
  // have 2 (stand-in) GPUs and 2 CPUs. The workers train on the CPU, 2 per node (--distributed-gpus).
  std::vector<std::string> argv{"/usr/bin/sbatch", "--wait", "--gres=gpu:2", "--cpus-per-task=2", "--time=5",
                                "--output=" + (work / "job.out"), "--error=" + (work / "job.err"),
                                "--chdir=" + work.path(), kBatchScript};
  for (const auto& f : mnist_flags(data.path(), work / "save", 16)) argv.push_back(f);
  argv.insert(argv.end(), {"--distributed-gpus", "2"});
  const auto r = run_process(argv, 400s, env);
  const std::string out = slurp(work / "job.out"), err = slurp(work / "job.err");
  INFO("sbatch:\n" << r.out << r.err << "\njob stdout:\n" << out << "\njob stderr:\n" << err);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(out, Catch::Contains("2 node(s) (localhost,node2), rendezvous at localhost:" + port));
  // 2 nodes x 2 workers: a world of 4; 320 samples, 4 ranks x 16 per update: 5 updates.
  check_one_model(out, err, 4, 5, work / "save");
  for (int rank = 0; rank < 4; ++rank) CHECK(count_of(err, fmt::format("[train] rank {} on ", rank)) == 1);
  // Node localhost's task hosts the store at MASTER_ADDR:MASTER_PORT and holds ranks 0-1; node2's
  // launcher (ranks 2-3) logs nothing.
  CHECK(count_of(err, "[launcher] rendezvous store listening on localhost:" + port) == 1);
  CHECK(count_of(err, "[launcher] started 2 workers, ranks 0..1") == 1);
  CHECK(count_of(err, "[launcher] started 2 workers") == 1);
}

}  // namespace slurm_test
