#pragma once

namespace hetseq::cli {

/// hetseq-train: parses the command line, builds the task, model, optimizer and schedule, trains and
/// validates. Returns the process exit code: 0 on success, 2 on a usage error (before any work
/// starts), 1 on any other error; errors are printed as one line on stderr.
int train_main(int argc, const char* const argv[]);

/// Runs `body` and turns its exceptions into one line on stderr (naming `program`) and an exit code: 2
/// for a usage error, 1 for any other. A worker that joined a distributed world leaves at once.
int run_guarded(int (*body)(int, const char* const*), const char* program, int argc, const char* const argv[]);

/// hetseq-eval: evaluates a saved model on data splits and prints loss and the task's metrics (with
/// --bf16/--fp16 under autocast), through the same Validator as training; builds no optimizer.
/// Exit codes as train_main.
int eval_main(int argc, const char* const argv[]);

}  // namespace hetseq::cli
