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
#include <utility>
#include <vector>

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

// The local workers started so far: their pids and, while they wait for it, the pipes that carry forked
// workers their init method.
struct LocalWorkers {
  std::vector<pid_t> pids;  // [worker]
  std::vector<int> init_pipes;  // [worker]: the write end, until send_init_method

  // After a failed start: the started workers are killed and reaped (a forked one waiting on its pipe sees it
  // close), so that the launcher's error is the only report.
  void kill_started() {
    for (int fd : init_pipes) ::close(fd);
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  }
};

// Forks the workers, each waiting on its pipe for the init method (Note [Forked workers]). Throws
// hetseq::InputError naming the worker and its rank where a pipe or a fork fails, the started ones killed.
void fork_local_workers(const LaunchOptions& o, LocalWorkers& workers) {
  const pid_t launcher = ::getpid();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  for (int64_t i = 0; i < o.num_workers; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      const int err = errno;
      workers.kill_started();
      throw InputError(fmt::format("[launcher] cannot start worker {} (rank {}): pipe: {}", i, o.first_rank + i,
                                   std::strerror(err)));
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[1]);
      for (int fd : workers.init_pipes) ::close(fd);  // the other workers' pipes: their ends must see EOF
      run_forked_worker(o, i, fds[0], launcher);
    }
    ::close(fds[0]);
    if (pid < 0) {
      const int err = errno;
      ::close(fds[1]);
      workers.kill_started();
      throw InputError(fmt::format("[launcher] cannot start worker {} (rank {}): fork: {}", i, o.first_rank + i,
                                   std::strerror(err)));
    }
    workers.pids.push_back(pid);
    workers.init_pipes.push_back(fds[1]);
  }
}

// The TCP store of --distributed-init-method tcp://HOST:PORT, hosted by the launcher on the address named only
// (Note [The store's address]), on the port it names or, for 0, the one it got. Throws hetseq::InputError naming
// the flag where it cannot, the started workers killed.
c10::intrusive_ptr<c10d::TCPStore> host_rendezvous_store(const LaunchOptions& o, LocalWorkers& workers) {
  c10d::TCPStoreOptions tcp;
  tcp.port = o.store_port;
  tcp.isServer = true;
  tcp.waitWorkers = false;
  tcp.timeout = o.store_timeout;
  try {
    tcp.masterListenFd = bind_store_socket(o.store_host, static_cast<uint16_t>(o.store_port),
                                           fmt::format("--distributed-init-method tcp://{}:{}", o.store_host,
                                                       o.store_port));
  } catch (const InputError&) {
    workers.kill_started();
    throw;
  }
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(o.store_host, tcp);
  } catch (const c10::Error& e) {
    workers.kill_started();
    throw InputError(fmt::format("--distributed-init-method tcp://{}:{}: cannot host the rendezvous store: {}",
                                 o.store_host, o.store_port, e.what_without_backtrace()));
  }
  log::info("[launcher] rendezvous store listening on {}:{}", o.store_host, store->getPort());
  return store;
}

// Tells the forked workers the init method, and closes their pipes.
void send_init_method(LocalWorkers& workers, const std::string& init_method) {
  for (int fd : workers.init_pipes) {
    write_all(fd, init_method);
    ::close(fd);
  }
  workers.init_pipes.clear();
}

// Starts the workers by fork+exec of this program (posix_spawn of /proc/self/exe) on their command lines, with
// this process's environment and the launcher's variables. Throws hetseq::InputError naming the worker and its
// rank where one cannot start, the started ones killed.
void exec_local_workers(const LaunchOptions& o, const std::string& init_method, LocalWorkers& workers) {
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
      workers.kill_started();
      throw InputError(fmt::format("[launcher] cannot start worker {} (rank {}): {}", i, o.first_rank + i, std::strerror(rc)));
    }
    workers.pids.push_back(pid);
  }
}

// Waits for the started workers until every one has exited, and returns the first non-zero exit code (0 when all
// succeeded). See Note [Clean stops]: a signal to the launcher reaches every worker, which then finishes its
// update, lets rank 0 save and leaves; a worker that has not gone after `stop_grace` is killed. A worker that
// fails stops the others, which get `grace`.
class WorkerWatch {
 public:
  WorkerWatch(const LaunchOptions& o, std::vector<pid_t> pids)
      : o_(o), pids_(std::move(pids)), done_(pids_.size(), false), remaining_(pids_.size()) {}

  int run() {
    stop_request::install();
    while (remaining_ > 0) {
      pass_on_signals();
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        record_exit(pid, status);
        continue;
      }
      kill_overdue();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return result_;
  }

 private:
  // The first SIGTERM or SIGINT asks every worker to stop; a second kills them now.
  void pass_on_signals() {
    if (!stopping_ && stop_request::requested()) {
      stopping_ = true;
      log::info("[launcher] {} received: asking the {} worker(s) to stop after their update (SIGTERM); they "
                "are killed if still running after {} s",
                stop_request::signal_name(stop_request::signal_number()), remaining_, o_.stop_grace.count());
      stop_others(o_.stop_grace);
    }
    if (stopping_ && kill_at_ != kNever && stop_request::signal_count() >= 2) {
      log::info("[launcher] a second signal: killing the workers now");
      kill_at_ = std::chrono::steady_clock::now();
    }
  }

  // One line per worker, so that whoever reads the launcher's log (a cluster's job output, the tests) sees how
  // every worker ended, not only the launcher's own code; the first failure stops the others.
  void record_exit(pid_t pid, int status) {
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (pids_[i] != pid || done_[i]) continue;
      done_[i] = true;
      --remaining_;
      const int code = exit_code_of(status);
      log::info("[launcher] rank {} (worker {}, pid {}) exited with code {}", o_.first_rank + static_cast<int64_t>(i),
                i, pid, code);
      if (code != 0 && result_ == 0) {
        result_ = code;
        if (!stopping_ && code != kExitStopped) {
          log::error("[launcher] rank {} (worker {}, pid {}) failed with exit code {}; stopping the other workers",
                     o_.first_rank + static_cast<int64_t>(i), i, pid, code);
          stop_others(o_.grace);
        }
      }
    }
  }

  // SIGTERM to every worker still running, and SIGKILL after `grace`.
  void stop_others(std::chrono::seconds grace) {
    for (size_t j = 0; j < pids_.size(); ++j) {
      if (!done_[j]) ::kill(pids_[j], SIGTERM);
    }
    kill_at_ = std::chrono::steady_clock::now() + grace;
  }

  void kill_overdue() {
    if (kill_at_ == kNever || std::chrono::steady_clock::now() <= kill_at_) return;
    for (size_t j = 0; j < pids_.size(); ++j) {
      if (!done_[j]) {
        log::error("[launcher] rank {} (pid {}) did not stop in time; killing it",
                   o_.first_rank + static_cast<int64_t>(j), pids_[j]);
        ::kill(pids_[j], SIGKILL);
      }
    }
    kill_at_ = kNever;
  }

  // When the workers still running get SIGKILL; never (the clock's end) until a stop or a failure sets it. A
  // time point rather than an optional: GCC 12 warned that the optional's value may be read uninitialized.
  static constexpr auto kNever = std::chrono::steady_clock::time_point::max();

  const LaunchOptions& o_;
  std::vector<pid_t> pids_;  // [worker]
  std::vector<bool> done_;   // [worker] exited and reaped
  size_t remaining_;
  int result_ = 0;
  bool stopping_ = false;  // a signal to the launcher was passed on
  std::chrono::steady_clock::time_point kill_at_ = kNever;
};

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
  LocalWorkers workers;
  // Forked workers come first, while this process runs one thread (Note [Forked workers]); each then
  // waits on its pipe for the init method.
  const bool forked = o.run_worker && fork_is_safe_here();
  if (forked) fork_local_workers(o, workers);
  c10::intrusive_ptr<c10d::TCPStore> store;  // kept alive while the workers run
  if (o.host_tcp_store) store = host_rendezvous_store(o, workers);
  const std::string init_method =
      store ? fmt::format("tcp://{}:{}", o.store_host, store->getPort()) : o.init_method;
  if (forked) {
    send_init_method(workers, init_method);
  } else {
    exec_local_workers(o, init_method, workers);
  }
  log::info("[launcher] started {} workers, ranks {}..{} ({})", o.num_workers, o.first_rank,
            o.first_rank + o.num_workers - 1, forked ? "forked" : "fork+exec");
  return WorkerWatch(o, std::move(workers.pids)).run();
}

}  // namespace hetseq
