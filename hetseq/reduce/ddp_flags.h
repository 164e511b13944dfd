#pragma once
/// The flags of DdpOptions (how the gradient reducer moves gradients), declared beside the struct: their
/// defaults are the struct's. hetseq-train shows them in its "Distributed training" group.

#include "hetseq/core/flag_set.h"
#include "hetseq/reduce/ddp_options.h"

namespace hetseq {

/// Declares --bucket-cap-mb, --find-unused-parameters, --broadcast-buffers, --ddp-comm-hook,
/// --shared-memory-reduce, --powersgd-rank and --powersgd-start-update in `flags`, with `defaults`' values
/// as their defaults.
void declare_ddp_flags(FlagSet& flags, const DdpOptions& defaults = {});

/// Reads those flags and checks them (DdpOptions::validate). Throws hetseq::UsageError naming the flag.
DdpOptions read_ddp_options(const FlagValues& values);

}  // namespace hetseq
