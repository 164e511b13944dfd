#pragma once
/// The flags of WorldOptions (how a worker joins its world), declared beside the struct: their defaults
/// are the struct's. hetseq-train shows them in its "Distributed training" group.

#include "hetseq/core/flag_set.h"
#include "hetseq/world/world_options.h"

namespace hetseq {

/// Declares --distributed-world-size, --distributed-rank, --distributed-backend, --distributed-init-method,
/// --device-id, --distributed-timeout, --rendezvous-timeout, --checkpoint-timeout and --debug-collectives
/// in `flags`, with `defaults`' values as their defaults.
void declare_world_flags(FlagSet& flags, const WorldOptions& defaults = {});

/// Reads those flags (--cpu is the common group's: see read_common_options). Throws hetseq::UsageError
/// naming the flag on a malformed or invalid value.
WorldOptions read_world_options(const FlagValues& values);

}  // namespace hetseq
