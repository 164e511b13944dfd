#include "hetseq/checkpoint/save_flags.h"

#include "hetseq/core/error.h"
#include "hetseq/core/flag_text.h"

namespace hetseq {

void declare_save_flags(FlagSet& flags, const CheckpointSaveOptions& d) {
  flags.add("save-dir", "path to save checkpoints", flag_text(d.save_dir)).per_rank()
      .add("save-interval", "save a checkpoint every N epochs", flag_text(d.save_interval))
      .add("save-interval-updates", "save a checkpoint (and validate) every N updates (0: off)",
           flag_text(d.save_interval_updates))
      .add("keep-interval-updates", "keep only the last N checkpoints of --save-interval-updates (-1: all)",
           flag_text(d.keep_interval_updates))
      .add("keep-last-epochs", "keep only the last N epoch checkpoints (-1: all)", flag_text(d.keep_last_epochs))
      .add_switch("no-save", "don't save models or checkpoints", d.no_save)
      .add_switch("no-epoch-checkpoints", "only store the last and best checkpoints", d.no_epoch_checkpoints)
      .add_switch("no-last-checkpoints", "don't store the last checkpoint", d.no_last_checkpoints)
      .add_switch("no-save-optimizer-state", "don't save the optimizer state in checkpoints", d.no_save_optimizer_state)
      .add("best-checkpoint-metric", "validation statistic that picks checkpoint_best.pt",
           flag_text(d.best_checkpoint_metric))
      .add_switch("maximize-best-checkpoint-metric", "a larger --best-checkpoint-metric is better",
                  d.maximize_best_checkpoint_metric);
}

CheckpointSaveOptions read_save_options(const FlagValues& values) {
  CheckpointSaveOptions s;
  s.save_dir = values.text("save-dir");
  s.no_save = values.flag("no-save");
  s.save_interval = values.positive("save-interval");
  s.save_interval_updates = values.integer("save-interval-updates");
  if (s.save_interval_updates < 0) throw UsageError("--save-interval-updates must be >= 0 (0: off)");
  s.keep_interval_updates = values.integer("keep-interval-updates");
  s.keep_last_epochs = values.integer("keep-last-epochs");
  for (const char* name : {"keep-interval-updates", "keep-last-epochs"}) {
    if (values.integer(name) < -1 || values.integer(name) == 0) {
      throw UsageError(fmt::format("--{} must be a positive number of checkpoints, or -1 to keep all", name));
    }
  }
  s.no_epoch_checkpoints = values.flag("no-epoch-checkpoints");
  s.no_last_checkpoints = values.flag("no-last-checkpoints");
  s.no_save_optimizer_state = values.flag("no-save-optimizer-state");
  s.best_checkpoint_metric = values.text("best-checkpoint-metric");
  if (s.best_checkpoint_metric.empty()) throw UsageError("--best-checkpoint-metric: empty name");
  s.maximize_best_checkpoint_metric = values.flag("maximize-best-checkpoint-metric");
  if (s.save_dir.empty()) throw UsageError("--save-dir: empty path");
  return s;
}

}  // namespace hetseq
