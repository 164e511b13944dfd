#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace hetseq {

/// How a node starts its local workers (HetSeq's --distributed-gpus G --distributed-rank R).
struct LaunchOptions {
  std::vector<std::string> argv;        // this process's command line, argv[0] included, aliases resolved
  int64_t num_workers = 1;              // G: workers on this node, worker i on device i
  int64_t first_rank = 0;               // R: global rank of worker 0
  int64_t world_size = 1;               // ranks over all nodes (passed on to every worker)
  std::string init_method;              // --distributed-init-method the workers use (a tcp:// port 0 is resolved)
  std::vector<int64_t> batch_sizes;     // [worker] --max-sentences of each local worker
  std::vector<int64_t> balance_caps;    // [worker] --balance-cap of each local worker (empty: none given)
  int64_t intra_op_threads = 0;         // per worker; 0 leaves LibTorch's default
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

/// The command line of local worker `i`: `argv` without the flags the launcher sets
/// (launcher_set_flags), plus --distributed-no-spawn, the world size, its rank, device, batch size
/// (and --balance-cap) and init method.
std::vector<std::string> worker_command_line(const LaunchOptions& options, int64_t i, const std::string& init_method);

/// Starts the local workers by fork+exec of this program (posix_spawn of /proc/self/exe) and waits
/// for them. When one fails, the others are stopped (SIGTERM, then SIGKILL after `grace`) and the
/// launcher reports the failing rank. SIGTERM or SIGINT to the launcher is passed on to every worker
/// as SIGTERM (see Note [Clean stops]). Returns 0 when all succeeded, else the first non-zero code.
int launch_workers(const LaunchOptions& options);

}  // namespace hetseq
