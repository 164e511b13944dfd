#pragma once
/// The flags of CheckpointOptions (saving, resuming, sample-id dumps), declared beside the struct: their
/// defaults are the struct's. hetseq-train shows them in "Checkpointing".

#include "hetseq/core/flag_set.h"
#include "hetseq/session/session_options.h"

namespace hetseq {

/// Declares the flags of CheckpointSaveOptions (declare_save_flags) and --restore-file, the --reset-*
/// switches, --optimizer-overrides and --dump-sample-ids in `flags`, with `defaults`' values as their
/// defaults.
void declare_checkpoint_flags(FlagSet& flags, const CheckpointOptions& defaults = {});

/// Reads and checks those flags. Throws hetseq::UsageError naming the flag.
CheckpointOptions read_checkpoint_options(const FlagValues& values);

}  // namespace hetseq
