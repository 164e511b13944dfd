#pragma once
/// The flags of AutoBalanceOptions (--auto-balance and its settings), declared beside the struct: their
/// defaults are the struct's. hetseq-train shows them in "Balancing".

#include "hetseq/core/flag_set.h"
#include "hetseq/session/session_options.h"

namespace hetseq {

/// Declares --auto-balance, --balance-interval, --balance-threshold and --balance-cap in `flags`, with
/// `defaults`' values as their defaults.
void declare_balance_flags(FlagSet& flags, const AutoBalanceOptions& defaults = {});

/// Reads and checks those flags. Throws hetseq::UsageError naming the flag.
AutoBalanceOptions read_balance_options(const FlagValues& values);

}  // namespace hetseq
