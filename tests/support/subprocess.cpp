#include "support/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <torch/cuda.h>
#include <torch/utils.h>

#include "hetseq/cli/train_command.h"
#include "hetseq/core/memory.h"
#include "hetseq/world/launcher.h"
#include "support/hooked_train.h"
#include "support/test_paths.h"

extern char** environ;

namespace hetseq::test {
namespace fs = std::filesystem;
namespace {

struct Child {
  pid_t pid = -1;
  std::string out_path, err_path;
  ProcessResult result;
  bool done = false;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Note [Forked test programs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Most of the suite's CPU time went into starting LibTorch: about 0.65 s of CPU for each of some 300
// starts of hetseq-train (operator registration, mapping 2.7 GB of libraries). This test binary links
// the same library, has paid that cost already, and runs hetseq-train's entry point (cli::train_main,
// cli::eval_main for hetseq-eval, hooked_train_main for the tests' hetseq-train-hooked) as well as the program
// does: its main() adds keep_freed_memory() alone. So a child that runs this build's hetseq-train, hetseq-eval
// or hetseq-train-hooked is a fork of the test process that
// calls the entry point, with the same descriptors, process group and environment that posix_spawn would
// give it, and LibTorch's intra-op threads as a new process has them (the test binary runs on one), as the launcher does for its workers (Note [Forked workers], hetseq/world/launcher.cpp). A
// fork is taken only where it is safe and alike:
//  - this process runs one thread (a child inherits locks that other threads held, but not the threads);
//  - no CUDA device is visible (CUDA does not survive a fork; on a GPU machine every child starts anew);
//  - the process is in its first test case (ctest runs one a process): state that the library keeps in
//    static variables is then still as a new process has it, since the test has at most set it up for
//    the programs it starts; a later test case of the same process may have used the library in-process.
//    (The test process installs no test hooks (Note [Test hooks], hetseq/core/test_hooks.cpp): a forked
//    hetseq-train-hooked installs those that the environment it was given asks for, as the program does.)
//  - the child's environment does not ask for a start anew: HETSEQ_WORKER_START=exec, or kTestStartEnv
//    (HETSEQ_TEST_START=exec), which the tests that find their processes by /proc/PID/cmdline pass, since
//    a fork keeps the test binary's command line.
// The launcher's and the installed programs' own starts stay covered: the scripts' tests (BERT, install,
// gpu_check, torchrun, Slurm) run the real binaries, and test_world_cli compares fork and exec.
using ProgramMain = int (*)(const std::vector<std::string>&);

int g_fresh_intra_op_threads = 0;  // remember_fresh_process_settings(); 0: not remembered
int g_test_cases_started = 0;      // note_test_case_started()

int64_t visible_cuda_devices() {
  static const int64_t n = torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  return n;
}

ProgramMain forkable_program(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  static const std::string train = binary_path("hetseq-train");
  static const std::string eval = binary_path("hetseq-eval");
  static const std::string hooked_train = binary_path(kHookedTrainProgram);
  ProgramMain program = argv[0] == train          ? ProgramMain{&hetseq::cli::train_main}
                        : argv[0] == eval         ? ProgramMain{&hetseq::cli::eval_main}
                        : argv[0] == hooked_train ? ProgramMain{&hooked_train_main}
                                                  : nullptr;
  if (program == nullptr) return nullptr;
  for (const char* key : {kTestStartEnv, hetseq::kWorkerStartEnv}) {
    const auto given = env.find(key);
    if (given != env.end() && given->second == "exec") return nullptr;
  }
  const char* inherited = std::getenv(kTestStartEnv);
  if (inherited != nullptr && std::string(inherited) == "exec") return nullptr;
  if (visible_cuda_devices() > 0 || g_test_cases_started > 1) return nullptr;
  return hetseq::fork_is_safe_here() ? program : nullptr;  // one thread, HETSEQ_WORKER_START not exec
}

// The child of a forked test program: the descriptors and process group posix_spawn would give it, the
// environment, then the program's entry point, and _Exit (the test process's objects are not its own).
[[noreturn]] void run_forked(ProgramMain program, const std::vector<std::string>& argv,
                             const std::map<std::string, std::string>& env, const Child& c) {
  ::setpgid(0, 0);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);  // the test framework's handlers are not the program's
  }
  const int in = ::open("/dev/null", O_RDONLY);
  const int out = ::open(c.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = ::open(c.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (in < 0 || out < 0 || err < 0) std::_Exit(127);
  ::dup2(in, 0);
  ::dup2(out, 1);
  ::dup2(err, 2);
  ::close(in);
  ::close(out);
  ::close(err);
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  hetseq::keep_freed_memory();
  if (g_fresh_intra_op_threads > 0) torch::set_num_threads(g_fresh_intra_op_threads);
  hetseq::run_forked_program(program, argv);
}

Child spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            const std::string& dir, size_t index) {
  Child c;
  c.out_path = dir + "/out." + std::to_string(index);
  c.err_path = dir + "/err." + std::to_string(index);
  if (const ProgramMain program = forkable_program(argv, env)) {  // Note [Forked test programs]
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    c.pid = ::fork();
    if (c.pid == 0) run_forked(program, argv, env, c);
    if (c.pid < 0) throw std::runtime_error("fork failed for " + argv[0] + ": " + std::strerror(errno));
    ::setpgid(c.pid, c.pid);  // as the child does: whichever runs first, a kill of the group reaches it
    return c;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, c.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, c.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);

  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  const int rc = posix_spawn(&c.pid, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error("posix_spawn failed for " + argv[0] + ": " + std::strerror(rc));
  return c;
}

bool reap(Child& c, int flags) {
  int status = 0;
  const pid_t r = ::waitpid(c.pid, &status, flags);
  if (r != c.pid) return false;
  c.result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.done = true;
  return true;
}

}  // namespace

std::vector<ProcessResult> run_processes(const std::vector<std::vector<std::string>>& argvs,
                                         std::chrono::seconds deadline,
                                         const std::vector<std::map<std::string, std::string>>& envs,
                                         std::chrono::seconds grace) {
  TempDir dir;
  std::vector<Child> children;
  for (size_t i = 0; i < argvs.size(); ++i) {
    children.push_back(spawn(argvs[i], i < envs.size() ? envs[i] : std::map<std::string, std::string>{}, dir.path(), i));
  }
  auto end = std::chrono::steady_clock::now() + deadline;
  bool failed = false;
  while (true) {
    bool all_done = true;
    for (auto& c : children) {
      if (!c.done && reap(c, WNOHANG) && c.result.exit_code != 0 && !failed) {
        failed = true;  // the others get `grace` from now
        end = std::min(end, std::chrono::steady_clock::now() + grace);
      }
      all_done = all_done && c.done;
    }
    if (all_done) break;
    if (std::chrono::steady_clock::now() > end) {
      for (auto& c : children) {
        if (c.done) continue;
        ::kill(-c.pid, SIGKILL);
        reap(c, 0);
        c.result.timed_out = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<ProcessResult> results;
  for (auto& c : children) {
    ::kill(-c.pid, SIGKILL);  // stragglers of the process group (spawned workers)
    c.result.out = slurp(c.out_path);
    c.result.err = slurp(c.err_path);
    results.push_back(c.result);
  }
  return results;
}

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::seconds deadline,
                          const std::map<std::string, std::string>& env) {
  return run_processes({argv}, deadline, {env}, deadline).front();
}

ProcessResult run_hetseq_train(std::vector<std::string> args) {
  args.insert(args.begin(), binary_path("hetseq-train"));
  return run_process(args, std::chrono::seconds(300));
}

Process::Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  Child c = spawn(argv, env, dir_.path(), 0);
  pid_ = c.pid;
}

Process::~Process() {
  ::kill(-pid_, SIGKILL);  // the process, or what is left of its group
  if (!reaped_) {
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

std::string Process::err_so_far() const { return slurp(dir_.path() + "/err.0"); }

bool Process::wait_for_err(const std::string& text, std::chrono::seconds deadline) const {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < end) {
    if (err_so_far().find(text) != std::string::npos) return true;
    siginfo_t info{};
    if (!reaped_ && ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid_) {
      return err_so_far().find(text) != std::string::npos;  // exited without writing it
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

ProcessResult Process::wait(std::chrono::seconds deadline) {
  wait_leaving_group(deadline);
  ::kill(-pid_, SIGKILL);  // stragglers of the process group
  return result_;
}

ProcessResult Process::wait_leaving_group(std::chrono::seconds deadline) {
  if (!reaped_) {
    Child c;
    c.pid = pid_;
    const auto end = std::chrono::steady_clock::now() + deadline;
    while (!reap(c, WNOHANG)) {
      if (std::chrono::steady_clock::now() > end) {
        ::kill(-pid_, SIGKILL);
        reap(c, 0);
        c.result.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    reaped_ = true;
    result_ = c.result;
    result_.out = slurp(dir_.path() + "/out.0");
    result_.err = slurp(dir_.path() + "/err.0");
  }
  return result_;
}

void Process::kill() { ::kill(-pid_, SIGKILL); }

std::optional<std::string> proc_stat_fields(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  const size_t paren = line.rfind(')');  // the command's name may hold spaces and parentheses
  return paren == std::string::npos || paren + 2 >= line.size() ? std::string() : line.substr(paren + 2);
}

bool process_alive(int pid) {
  const auto fields = proc_stat_fields(pid);
  return fields && (fields->empty() || (*fields)[0] != 'Z');
}

void note_test_case_started() { ++g_test_cases_started; }

void remember_fresh_process_settings() { g_fresh_intra_op_threads = torch::get_num_threads(); }

std::string binary_path(const std::string& name) { return binary_dir() + "/bin/" + name; }

}  // namespace hetseq::test
