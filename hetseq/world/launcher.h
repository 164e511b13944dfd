#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hetseq {

/// How a node starts its local workers (HetSeq's --distributed-gpus G --distributed-rank R).
struct LaunchOptions {
  int64_t num_workers = 1;              // G: workers on this node, worker i on device i
  int64_t first_rank = 0;               // R: global rank of worker 0
  int64_t world_size = 1;               // ranks over all nodes
  std::string init_method;              // the init method the workers use (a tcp:// port 0 is resolved)
  /// The command line of local worker `i` that joins through `init_method` (the resolved one). The
  /// program that launches knows its flags; the launcher knows none (cli/spawn.h: worker_command_line).
  std::function<std::vector<std::string>(int64_t i, const std::string& init_method)> command_line;
  /// Runs a worker in this process on its command line and returns its exit code (hetseq-train's own
  /// entry point). When set, and this process may fork safely, each worker is a fork of the launcher
  /// that calls it instead of a new start of the program: see Note [Forked workers].
  std::function<int(const std::vector<std::string>& argv)> run_worker;
  /// When this node holds rank 0 and the init method is tcp://HOST:PORT, the launcher hosts the TCP
  /// store itself (so PORT may be 0: it reads back the port it got and tells its workers).
  bool host_tcp_store = false;
  std::string store_host;
  uint16_t store_port = 0;
  std::chrono::milliseconds store_timeout{std::chrono::minutes(5)};
  std::chrono::seconds grace{10};       // after a worker failed: how long the others get before SIGKILL
  /// After SIGTERM or SIGINT to the launcher: how long the workers get to finish their update, save
  /// and leave before SIGKILL (Slurm's default KillWait is 30 s).
  std::chrono::seconds stop_grace{60};
};

/// Environment variable with the launcher's pid, so that a worker dies with it (see
/// stop_request::die_with_launcher).
inline constexpr const char* kLauncherPidEnv = "HETSEQ_LAUNCHER_PID";

/// Environment variable the launcher sets for its workers when it hosts the TCP store.
inline constexpr const char* kStoreHostedEnv = "HETSEQ_STORE_HOSTED";

/// Environment variable that makes the launcher start its workers by fork+exec even where it could fork
/// them alone (HETSEQ_WORKER_START=exec): Note [Forked workers].
inline constexpr const char* kWorkerStartEnv = "HETSEQ_WORKER_START";

/// Whether this process may fork a program's entry point safely (Note [Forked workers]): it runs one
/// thread, and HETSEQ_WORKER_START=exec does not ask for a start anew.
bool fork_is_safe_here();

/// In a forked child, runs `program` on `argv` as a new process of it would start (the logging of a new
/// process, an escaped exception as one line on stderr naming argv[0]), then leaves with its exit code,
/// the streams flushed, by _Exit: the parent's static objects are the parent's to destroy.
[[noreturn]] void run_forked_program(const std::function<int(const std::vector<std::string>&)>& program,
                                     const std::vector<std::string>& argv);

/// Starts the local workers, as forks of this process that run `run_worker` (Note [Forked workers]) or
/// by fork+exec of this program (posix_spawn of /proc/self/exe), and waits for them. When one fails, the others are stopped (SIGTERM, then SIGKILL after `grace`) and the
/// launcher reports the failing rank. SIGTERM or SIGINT to the launcher is passed on to every worker
/// as SIGTERM (see Note [Clean stops]). Returns 0 when all succeeded, else the first non-zero code.
int launch_workers(const LaunchOptions& options);

}  // namespace hetseq
