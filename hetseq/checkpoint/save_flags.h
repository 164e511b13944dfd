#pragma once
/// The flags of CheckpointSaveOptions (when and where checkpoints are written), declared beside the
/// struct: their defaults are the struct's. hetseq-train shows them in its "Checkpointing" group.

#include "hetseq/checkpoint/save_options.h"
#include "hetseq/core/flag_set.h"

namespace hetseq {

/// Declares --save-dir, --save-interval, --save-interval-updates, --keep-interval-updates,
/// --keep-last-epochs, --no-save, --no-epoch-checkpoints, --no-last-checkpoints,
/// --no-save-optimizer-state, --best-checkpoint-metric and --maximize-best-checkpoint-metric in `flags`,
/// with `defaults`' values as their defaults.
void declare_save_flags(FlagSet& flags, const CheckpointSaveOptions& defaults = {});

/// Reads and checks those flags. Throws hetseq::UsageError naming the flag.
CheckpointSaveOptions read_save_options(const FlagValues& values);

}  // namespace hetseq
