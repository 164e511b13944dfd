#include "hetseq/world/launcher.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/stop_request.h"

extern char** environ;

namespace hetseq {
namespace {

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

int launch_workers(const LaunchOptions& o) {
  HETSEQ_ASSERT(o.command_line != nullptr, "a launch without the workers' command line");
  if (o.first_rank + o.num_workers > o.world_size) {
    throw UsageError(fmt::format("--distributed-world-size {} is too small for this node's {} workers from "
                                 "--distributed-rank {}; the world needs at least {} ranks",
                                 o.world_size, o.num_workers, o.first_rank, o.first_rank + o.num_workers));
  }
  std::string init_method;
  c10::intrusive_ptr<c10d::TCPStore> store;  // kept alive while the workers run
  if (o.host_tcp_store) {
    c10d::TCPStoreOptions tcp;
    tcp.port = o.store_port;
    tcp.isServer = true;
    tcp.waitWorkers = false;
    tcp.timeout = o.store_timeout;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(o.store_host, tcp);
    } catch (const c10::Error& e) {
      throw InputError(fmt::format("--distributed-init-method tcp://{}:{}: cannot host the rendezvous store: {}",
                                   o.store_host, o.store_port, e.what_without_backtrace()));
    }
    init_method = fmt::format("tcp://{}:{}", o.store_host, store->getPort());
    log::info("[launcher] rendezvous store listening on {}:{}", o.store_host, store->getPort());
  } else {
    init_method = o.init_method;
  }

  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  if (o.host_tcp_store) env_strings.push_back(std::string(kStoreHostedEnv) + "=1");
  env_strings.push_back(std::string(kLauncherPidEnv) + "=" + std::to_string(::getpid()));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  std::vector<pid_t> pids;  // [worker]
  for (int64_t i = 0; i < o.num_workers; ++i) {
    std::vector<std::string> args = o.command_line(i, init_method);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
    if (rc != 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      throw InputError(fmt::format("[launcher] cannot start worker {} (rank {}): {}", i, o.first_rank + i, std::strerror(rc)));
    }
    pids.push_back(pid);
  }
  log::info("[launcher] started {} workers, ranks {}..{}", o.num_workers, o.first_rank, o.first_rank + o.num_workers - 1);

  // See Note [Clean stops]: a signal to the launcher reaches every worker, which then finishes its
  // update, lets rank 0 save and leaves; a worker that has not gone after `stop_grace` is killed.
  stop_request::install();
  int result = 0;
  bool stopping = false;
  std::vector<bool> done(pids.size(), false);
  size_t remaining = pids.size();
  // When the workers still running get SIGKILL; never (the clock's end) until a stop or a failure sets it. A
  // time point rather than an optional: GCC 12 warned that the optional's value may be read uninitialized.
  constexpr auto kNever = std::chrono::steady_clock::time_point::max();
  auto kill_at = kNever;
  auto stop_others = [&](std::chrono::seconds grace) {
    for (size_t j = 0; j < pids.size(); ++j) {
      if (!done[j]) ::kill(pids[j], SIGTERM);
    }
    kill_at = std::chrono::steady_clock::now() + grace;
  };
  while (remaining > 0) {
    if (!stopping && stop_request::requested()) {
      stopping = true;
      log::info("[launcher] {} received: asking the {} worker(s) to stop after their update (SIGTERM); they "
                "are killed if still running after {} s",
                stop_request::signal_name(stop_request::signal_number()), remaining, o.stop_grace.count());
      stop_others(o.stop_grace);
    }
    if (stopping && kill_at != kNever && stop_request::signal_count() >= 2) {
      log::info("[launcher] a second signal: killing the workers now");
      kill_at = std::chrono::steady_clock::now();
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] != pid || done[i]) continue;
        done[i] = true;
        --remaining;
        const int code = exit_code_of(status);
        // One line per worker, so that whoever reads the launcher's log (a cluster's job output, the
        // tests) sees how every worker ended, not only the launcher's own code.
        log::info("[launcher] rank {} (worker {}, pid {}) exited with code {}", o.first_rank + static_cast<int64_t>(i),
                  i, pid, code);
        if (code != 0 && result == 0) {
          result = code;
          if (!stopping && code != kExitStopped) {
            log::error("[launcher] rank {} (worker {}, pid {}) failed with exit code {}; stopping the other workers",
                       o.first_rank + static_cast<int64_t>(i), i, pid, code);
            stop_others(o.grace);
          }
        }
      }
      continue;
    }
    if (kill_at != kNever && std::chrono::steady_clock::now() > kill_at) {
      for (size_t j = 0; j < pids.size(); ++j) {
        if (!done[j]) {
          log::error("[launcher] rank {} (pid {}) did not stop in time; killing it",
                     o.first_rank + static_cast<int64_t>(j), pids[j]);
          ::kill(pids[j], SIGKILL);
        }
      }
      kill_at = kNever;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace hetseq
