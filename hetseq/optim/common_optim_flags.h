#pragma once
/// The flags of CommonOptimOptions (those that several optimizers or schedules read), declared beside
/// the struct: their defaults are the struct's. --lr, which fills CommonOptimOptions::lrs, is the
/// session's (OptimizationOptions::lr).

#include "hetseq/core/flag_set.h"
#include "hetseq/optim/registry.h"

namespace hetseq::optim {

/// Declares --weight-decay in `optimization` and --force-anneal and --warmup-updates in `schedule` (the
/// two help groups), with `defaults`' values as their defaults.
void declare_common_optim_flags(FlagSet& optimization, FlagSet& schedule, const CommonOptimOptions& defaults = {});

/// Reads and checks those flags, with `lrs` (--lr, one per epoch). Throws hetseq::UsageError naming the
/// flag.
CommonOptimOptions read_common_optim_options(const FlagValues& values, std::vector<double> lrs);

}  // namespace hetseq::optim
