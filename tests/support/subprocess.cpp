#include "support/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

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

Child spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            const std::string& dir, size_t index) {
  Child c;
  c.out_path = dir + "/out." + std::to_string(index);
  c.err_path = dir + "/err." + std::to_string(index);
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

bool process_alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

std::string binary_path(const std::string& name) { return binary_dir() + "/bin/" + name; }

}  // namespace hetseq::test
