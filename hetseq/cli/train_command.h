#pragma once

namespace hetseq::cli {

/// hetseq-train: parses the command line, builds the task, model, optimizer and schedule, trains and
/// validates. Returns the process exit code: 0 on success, 2 on a usage error (before any work
/// starts), 1 on any other error; errors are printed as one line on stderr.
int train_main(int argc, const char* const argv[]);

/// hetseq-eval: evaluates a saved model on data splits and prints loss and the task's metrics.
/// Exit codes as train_main.
int eval_main(int argc, const char* const argv[]);

}  // namespace hetseq::cli
