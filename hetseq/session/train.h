#pragma once
/// Training from C++ without a command line: options in (hetseq::TrainOptions), a task, one call,
/// a result out. See docs/API.md, "Run a session from C++".

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "hetseq/session/session_options.h"
#include "hetseq/task/task.h"

namespace hetseq {

/// Builds a task for a session, on the device of `context` (a Task object of a program's own).
using TaskFactory = std::function<std::unique_ptr<Task>(const TaskContext& context)>;

/// What a training run ended with, on this rank (every rank trains in lockstep, so the figures agree).
struct TrainResult {
  int64_t last_epoch = 0;    // the last epoch trained (0: none)
  int64_t num_updates = 0;   // updates done, those before a resume included
  bool stopped = false;      // ended on SIGTERM or SIGINT, after saving checkpoint_last.pt (Note [Clean stops])
  /// The last epoch's training statistics as logged (`loss` and `nll_loss` in bits, `ppl`, `lr`,
  /// `num_updates`, the task's derived metrics, ...), by name: of the epoch that a limit stopped inside,
  /// if one did; empty when no update ran.
  std::map<std::string, double> train;
  /// The last validation's statistics of the first valid subset (`loss`, `nll_loss`, `ppl`, the task's
  /// derived metrics, `sample_size`), by name; empty when none ran.
  std::map<std::string, double> valid;
};

/// Trains the registered task `options.common.task` (a TaskSpec name, e.g. from a --user-dir library or
/// linked in) on this process's rank, as hetseq-train does with the same options, and returns the
/// result. `task_flags` are the values the task reads (its own flags and general ones such as `data`, by
/// long name, as text: {{"data", "/path"}, {"hidden", "16"}}); its flags left out take their defaults.
/// TaskSpec::defaults do not apply: `options` are taken as they are.
///
/// An empty `options.optimization.make_optimizer` or `make_lr_scheduler` is built from the `optimizer` or
/// `lr_scheduler` name with `lr` and that optimizer's or schedule's default flags. The world comes from
/// `options.distributed.world` (one process when it names none; each rank of a distributed run calls
/// train in its own process, and the call returns after every rank finished). As in hetseq-train, SIGTERM
/// and SIGINT stop the run cleanly once the session is built (the handlers stay installed afterwards):
/// the update in flight finishes, checkpoint_last.pt is saved and the result says `stopped`.
///
/// Throws hetseq::UsageError (a bad option, an unknown task or flag), hetseq::InputError (a file, a
/// peer) or hetseq::InternalError, as hetseq-train exits with codes 2, 3/4 and 1. After an error in a
/// distributed run the peers fail too: leave the process soon.
TrainResult train(const TrainOptions& options, const std::map<std::string, std::string>& task_flags = {});

/// As above with a task of the program's own, built by `make_task` once the rank's device is known;
/// `options.common.task` names it in logs and checkpoints (a checkpoint resumes only the same name).
TrainResult train(const TrainOptions& options, const TaskFactory& make_task);

}  // namespace hetseq
