#pragma once
// Real child processes for tests: started with posix_spawn (fork+exec), or, for this build's hetseq-train
// and hetseq-eval while the test process runs one thread, as a fork that calls the program's entry point
// (Note [Forked test programs], subprocess.cpp); waited for with a deadline, killed (whole process group)
// when they overrun.

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace hetseq::test {

/// A child whose environment sets this to "exec" runs the real program (posix_spawn) where a fork could
/// serve (Note [Forked test programs]): for the tests that find their processes by /proc/PID/cmdline.
inline constexpr const char* kTestStartEnv = "HETSEQ_TEST_START";

struct ProcessResult {
  int exit_code = -1;   // exit status, or 128 + signal when killed by a signal
  bool timed_out = false;
  std::string out;      // stdout
  std::string err;      // stderr
};

/// Runs `argv` (argv[0] is a path) with extra environment variables, waits at most `deadline`, kills
/// the process group on timeout, and returns its status and output.
ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::seconds deadline,
                          const std::map<std::string, std::string>& env = {});

/// This build's hetseq-train with `args`, run as run_process does within 300 s.
ProcessResult run_hetseq_train(std::vector<std::string> args);

/// Several processes started together and waited for with one deadline; once one fails (a non-zero
/// exit or a signal), the others get `grace` to finish (to report the failure of their own that a
/// test may expect) before they are killed and marked timed out, so that a failing multi-rank test
/// fails in seconds rather than waiting out the whole deadline.
std::vector<ProcessResult> run_processes(const std::vector<std::vector<std::string>>& argvs,
                                         std::chrono::seconds deadline,
                                         const std::vector<std::map<std::string, std::string>>& envs = {},
                                         std::chrono::seconds grace = std::chrono::seconds(30));

/// A child process started now and waited for later, for tests that start ranks one after another
/// (e.g. reading the port that rank 0's store got before starting the others).
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~Process();  // kills the process group if still running
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  /// What the process wrote to stderr so far.
  std::string err_so_far() const;
  /// Waits until stderr contains `text` or the process exits or `deadline` passes; returns whether
  /// the text appeared.
  bool wait_for_err(const std::string& text, std::chrono::seconds deadline) const;
  /// Waits at most `deadline` for the exit, kills the process group after that; returns the result.
  ProcessResult wait(std::chrono::seconds deadline);
  /// As wait(), but leaves the rest of the process group alone when the process exited in time (the
  /// destructor kills it), so that a test can look for children that outlived their parent.
  ProcessResult wait_leaving_group(std::chrono::seconds deadline);
  /// Sends SIGKILL to the process group.
  void kill();
  int pid() const { return pid_; }

 private:
  TempDir dir_;
  int pid_ = -1;
  bool reaped_ = false;
  ProcessResult result_;
};

/// Remembers what a new process starts with that the test binary then changes for itself (LibTorch's
/// intra-op threads), so that a forked test program starts as hetseq-train would (Note [Forked test
/// programs]). The test binary's main() calls it first.
void remember_fresh_process_settings();

/// Counts the test cases this process has started (a Catch2 listener in test_main.cpp calls it): only the
/// first one forks its programs (Note [Forked test programs]).
void note_test_case_started();

/// Path of a built program: build/bin/<name>.
std::string binary_path(const std::string& name);

/// Whether process `pid` exists and is not a zombie (in a container, PID 1 may never reap orphans).
bool process_alive(int pid);

/// The fields of /proc/PID/stat after the command's name, its state first ("S 1234 ..."; empty where the line
/// cannot be read so); std::nullopt where the process is gone.
std::optional<std::string> proc_stat_fields(int pid);

}  // namespace hetseq::test
