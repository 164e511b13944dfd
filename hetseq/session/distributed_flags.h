#pragma once
/// The flags of DistributedOptions, declared beside the struct: their defaults are the struct's.
/// hetseq-train shows them in "Distributed training", with those of WorldOptions (world_flags.h) and
/// DdpOptions (ddp_flags.h).

#include "hetseq/core/flag_set.h"
#include "hetseq/session/session_options.h"

namespace hetseq {

/// Declares the group in `flags`, with `defaults`' values as their defaults.
void declare_distributed_flags(FlagSet& flags, const DistributedOptions& defaults = {});

/// Reads and checks those flags (--cpu too, which the common group declares). Throws hetseq::UsageError
/// naming the flag.
DistributedOptions read_distributed_options(const FlagValues& values);

}  // namespace hetseq
