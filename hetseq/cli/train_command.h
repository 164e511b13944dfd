#pragma once

#include <string>
#include <vector>

namespace hetseq::cli {

/// hetseq-train: parses the command line, builds the task, model, optimizer and schedule, trains and
/// validates. Returns the process exit code of hetseq::ExitCode (core/error.h): 0 done, 1 a bug, 2 a
/// usage error (before any work starts), 3 bad input, 4 a lost peer, 5 stopped by a signal; errors are
/// printed as one line on stderr.
int train_main(int argc, const char* const argv[]);

/// train_main on a command line held as strings (argv[0] first), as a forked worker runs it.
int train_main(const std::vector<std::string>& argv);

/// Runs `body` and turns its exceptions into one line on stderr (naming `program`) and an exit code of
/// hetseq::ExitCode by the error's kind. A worker that joined a distributed world leaves at once.
int run_guarded(int (*body)(int, const char* const*), const char* program, int argc, const char* const argv[]);

/// hetseq-eval: evaluates a saved model on data splits and prints loss and the task's metrics (with
/// --bf16/--fp16 under autocast), through the same Validator as training; builds no optimizer.
/// Exit codes as train_main.
int eval_main(int argc, const char* const argv[]);

/// eval_main on a command line held as strings (argv[0] first).
int eval_main(const std::vector<std::string>& argv);

}  // namespace hetseq::cli
