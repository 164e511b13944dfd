#include "hetseq/world/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/stop_request.h"
#include "hetseq/world/store_socket.h"

extern char** environ;

namespace hetseq {
namespace {

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// Note [Forked workers]
// ~~~~~~~~~~~~~~~~~~~~~
// Starting hetseq-train again costs about 0.65 s of CPU before main() runs: LibTorch registers its
// operators and the kernel maps 2.7 GB of libraries. A launcher that has done all of that already can
// fork its workers instead: each child calls hetseq-train's entry point on the command line an exec'd
// worker would get, with the environment it would get, and leaves with _Exit (the parent's static
// objects are the parent's to destroy). On this 2-core machine that is most of a test suite's process
// starts. A fork is safe only while the launcher runs one thread, because a child inherits no thread
// but every lock that another thread held. So:
//  - the workers are forked first, before the launcher hosts the TCP store (whose server is a thread);
//    each waits on a pipe for the init method, which names the port that the store got;
//  - a launcher with more than one thread (a CUDA driver's, an OpenMP pool's), or where a GPU is used
//    (CUDA does not survive a fork), or where HETSEQ_WORKER_START=exec asks for it, starts its workers
//    by posix_spawn of /proc/self/exe as before. A forked worker and an exec'd one run the same code
//    from the same command line; the launcher's log line says which start was used.
int threads_in_this_process() {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    ++n;
  }
  return n;
}


// Reads the pipe to its end: the init method that the parent writes once it hosts the store.
std::string read_all(int fd) {
  std::string out;
  char buf[512];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return out;
    }
  }
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the child is gone: the wait loop reports its exit
    done += static_cast<size_t>(n);
  }
}

// The forked child of worker `i`: waits for the init method, then runs the worker (Note [Forked workers]).
[[noreturn]] void run_forked_worker(const LaunchOptions& o, int64_t i, int read_fd, pid_t launcher) {
  const std::string init_method = read_all(read_fd);
  ::close(read_fd);
  if (init_method.empty()) std::_Exit(kExitInternal);  // the launcher failed before it could say; it reports
  if (o.host_tcp_store) ::setenv(kStoreHostedEnv, "1", 1);
  ::setenv(kLauncherPidEnv, std::to_string(launcher).c_str(), 1);
  run_forked_program(o.run_worker, o.command_line(i, init_method));
}

}  // namespace

bool fork_is_safe_here() {
  const char* start = std::getenv(kWorkerStartEnv);
  if (start != nullptr && std::string(start) == "exec") return false;
  return threads_in_this_process() == 1;
}

void run_forked_program(const std::function<int(const std::vector<std::string>&)>& program,
                        const std::vector<std::string>& argv) {
  log::set_rank(0);  // as in a new process, until a worker joins its world
  log::enable_all_ranks(false);
  int code = kExitInternal;
  try {
    code = program(argv);
  } catch (const std::exception& e) {
    std::cerr << argv.front() << ": error: " << e.what() << std::endl;
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

int launch_workers(const LaunchOptions& o) {
  HETSEQ_ASSERT(o.command_line != nullptr, "a launch without the workers' command line");
  if (o.first_rank + o.num_workers > o.world_size) {
    throw UsageError(fmt::format("--distributed-world-size {} is too small for this node's {} workers from "
                                 "--distributed-rank {}; the world needs at least {} ranks",
                                 o.world_size, o.num_workers, o.first_rank, o.first_rank + o.num_workers));
  }
  std::vector<pid_t> pids;  // [worker]
  // Forked workers come first, while this process runs one thread (Note [Forked workers]); each then
  // waits on its pipe for the init method.
  const bool forked = o.run_worker && fork_is_safe_here();
  std::vector<int> init_pipes;  // [worker]: the write end
  auto kill_started = [&] {
    for (int fd : init_pipes) ::close(fd);
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  };
  if (forked) {
    const pid_t launcher = ::getpid();
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    for (int64_t i = 0; i < o.num_workers; ++i) {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) {
        const int err = errno;
        kill_started();
        throw InputError(fmt::format("[launcher] cannot start worker {} (rank {}): pipe: {}", i, o.first_rank + i,
                                     std::strerror(err)));
      }
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(fds[1]);
        for (int fd : init_pipes) ::close(fd);  // the other workers' pipes: their ends must see EOF
        run_forked_worker(o, i, fds[0], launcher);
      }
      ::close(fds[0]);
      if (pid < 0) {
        const int err = errno;
        ::close(fds[1]);
        kill_started();
        throw InputError(fmt::format("[launcher] cannot start worker {} (rank {}): fork: {}", i, o.first_rank + i,
                                     std::strerror(err)));
      }
      pids.push_back(pid);
      init_pipes.push_back(fds[1]);
    }
  }

  std::string init_method;
  c10::intrusive_ptr<c10d::TCPStore> store;  // kept alive while the workers run
  if (o.host_tcp_store) {
    c10d::TCPStoreOptions tcp;
    tcp.port = o.store_port;
    tcp.isServer = true;
    tcp.waitWorkers = false;
    tcp.timeout = o.store_timeout;
    try {  // Note [The store's address]: on the address named only.
      tcp.masterListenFd = bind_store_socket(o.store_host, static_cast<uint16_t>(o.store_port),
                                             fmt::format("--distributed-init-method tcp://{}:{}", o.store_host,
                                                         o.store_port));
    } catch (const InputError&) {
      kill_started();
      throw;
    }
    try {
      store = c10::make_intrusive<c10d::TCPStore>(o.store_host, tcp);
    } catch (const c10::Error& e) {
      kill_started();
      throw InputError(fmt::format("--distributed-init-method tcp://{}:{}: cannot host the rendezvous store: {}",
                                   o.store_host, o.store_port, e.what_without_backtrace()));
    }
    init_method = fmt::format("tcp://{}:{}", o.store_host, store->getPort());
    log::info("[launcher] rendezvous store listening on {}:{}", o.store_host, store->getPort());
  } else {
    init_method = o.init_method;
  }

  if (forked) {
    for (int fd : init_pipes) {
      write_all(fd, init_method);
      ::close(fd);
    }
    init_pipes.clear();
  } else {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    if (o.host_tcp_store) env_strings.push_back(std::string(kStoreHostedEnv) + "=1");
    env_strings.push_back(std::string(kLauncherPidEnv) + "=" + std::to_string(::getpid()));
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    for (int64_t i = 0; i < o.num_workers; ++i) {
      std::vector<std::string> args = o.command_line(i, init_method);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      pid_t pid = -1;
      const int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
      if (rc != 0) {
        kill_started();
        throw InputError(fmt::format("[launcher] cannot start worker {} (rank {}): {}", i, o.first_rank + i, std::strerror(rc)));
      }
      pids.push_back(pid);
    }
  }
  log::info("[launcher] started {} workers, ranks {}..{} ({})", o.num_workers, o.first_rank,
            o.first_rank + o.num_workers - 1, forked ? "forked" : "fork+exec");

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
