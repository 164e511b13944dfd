#pragma once
// Real child processes for tests: started with posix_spawn (fork+exec, never a bare fork once LibTorch
// runs threads), waited for with a deadline, killed (whole process group) when they overrun.

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace hetseq::test {

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

/// Several processes started together and waited for with one deadline; when one fails (non-zero
/// exit), the others get `grace` to finish before they are killed.
std::vector<ProcessResult> run_processes(const std::vector<std::vector<std::string>>& argvs,
                                         std::chrono::seconds deadline,
                                         const std::vector<std::map<std::string, std::string>>& envs = {});

/// Path of a built program: build/bin/<name>.
std::string binary_path(const std::string& name);

}  // namespace hetseq::test
