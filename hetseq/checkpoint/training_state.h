#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hetseq/checkpoint/checkpoint.h"
#include "hetseq/data/epoch_batch_iterator.h"
#include "hetseq/train/controller.h"

namespace hetseq {

/// What a checkpoint records besides the Controller's state.
struct CaptureContext {
  IteratorPosition next;      // where the next update starts
  SavedDataPlan data_plan;    // the plan of the epoch being trained
  std::optional<double> best;
  std::string task, model_digest, options;
  bool with_optimizer_state = true;  // false with --no-save-optimizer-state
};

/// The state of `controller` (model, optimizer, LR scheduler, update count, meters, RNG) and `context`
/// as a checkpoint.
Checkpoint capture_checkpoint(Controller& controller, const CaptureContext& context);

/// What to take from a checkpoint on resume (the --reset-* flags and --optimizer-overrides).
struct ResumeOptions {
  bool reset_dataloader = false;
  bool reset_lr_scheduler = false;
  bool reset_meters = false;
  bool reset_optimizer = false;
  std::vector<std::pair<std::string, double>> optimizer_overrides;
};

/// Throws hetseq::InputError naming `source` when the checkpoint was written by another task or for
/// a model of other parameter names or shapes.
void check_checkpoint_fits(const Checkpoint& checkpoint, const std::string& task, const std::string& model_digest,
                           const std::string& source);

/// Restores `checkpoint` into `controller` (whose model already holds the checkpoint's weights, see
/// load_model_tensors): optimizer state and hyper-parameters (then the overrides), LR scheduler,
/// update count, meters and RNG, each unless reset. Returns where training continues ({1, 0} with
/// reset_dataloader). Throws hetseq::InputError naming `source` when the optimizer or scheduler
/// kind differs without the matching reset flag.
IteratorPosition restore_checkpoint(Controller& controller, const Checkpoint& checkpoint, const ResumeOptions& options,
                                    const std::string& source);

}  // namespace hetseq
