#pragma once
/// The flags of CommonOptions (task, seed, device, logging), declared beside the struct: their defaults
/// are the struct's. hetseq-train and hetseq-eval show them in their first group.

#include "hetseq/core/flag_set.h"
#include "hetseq/session/session_options.h"

namespace hetseq {

/// Declares --task, --seed, --cpu, --no-progress-bar, --log-interval, --log-format, --intra-op-threads,
/// --deterministic and --cuda-graph in `flags`, with `defaults`' values as their defaults.
void declare_common_flags(FlagSet& flags, const CommonOptions& defaults = {});

/// Reads and checks those flags; --task must name a registered task. Throws hetseq::UsageError naming the
/// flag.
CommonOptions read_common_options(const FlagValues& values);

}  // namespace hetseq
