#pragma once
/// The flags of OptimizationOptions (when to stop, clipping, update frequency, learning rates, the
/// optimizer and schedule by name), declared beside the struct: their defaults are the struct's.

#include "hetseq/core/flag_set.h"
#include "hetseq/session/session_options.h"

namespace hetseq {

/// Declares the group "Optimization" in `optimization` and the general flags of "Learning rate scheduler"
/// in `schedule` (the optimizers' and schedules' own flags are theirs: optim::optimizers().declare_flags),
/// with `defaults`' values as their defaults; --weight-decay, --force-anneal and --warmup-updates are
/// CommonOptimOptions' (declare_common_optim_flags).
void declare_optimization_flags(FlagSet& optimization, FlagSet& schedule, const OptimizationOptions& defaults = {});

/// Reads and checks those flags (OptimizationOptions::validate), and configures the optimizer and
/// schedule named from `values` (every registered one's flags are checked, chosen or not). Throws
/// hetseq::UsageError naming the flag.
OptimizationOptions read_optimization_options(const FlagValues& values);

}  // namespace hetseq
