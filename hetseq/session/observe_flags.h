#pragma once
/// The flags of ObserveOptions (traces, step profile, TensorBoard, JSON log), declared beside the struct:
/// their defaults are the struct's. hetseq-train shows them in "Seeing a run".

#include "hetseq/core/flag_set.h"
#include "hetseq/session/session_options.h"

namespace hetseq {

/// Declares --trace-dir, --trace-updates, --trace-ops, --step-profile, --tensorboard-logdir and --json-log
/// in `flags`, with `defaults`' values as their defaults.
void declare_observe_flags(FlagSet& flags, const ObserveOptions& defaults = {});

/// Reads and checks those flags. Throws hetseq::UsageError naming the flag.
ObserveOptions read_observe_options(const FlagValues& values);

}  // namespace hetseq
