#pragma once
/// The flags of MixedPrecisionOptions (--fp16, --bf16 and the loss scaling of --fp16), declared beside
/// the struct: their defaults are the struct's. hetseq-train and hetseq-eval show them in "Mixed precision".

#include "hetseq/core/flag_set.h"
#include "hetseq/session/session_options.h"

namespace hetseq {

/// Declares --fp16, --bf16, the loss scaler's flags (declare_loss_scaler_flags) and --fp16-scale-window in
/// `flags`, with `defaults`' values as their defaults.
void declare_precision_flags(FlagSet& flags, const MixedPrecisionOptions& defaults = {});

/// Reads and checks those flags: --fp16 and --bf16 exclude each other, and a loss scaling flag given
/// without --fp16 is an error. Throws hetseq::UsageError naming the flag.
MixedPrecisionOptions read_precision_options(const FlagValues& values);

}  // namespace hetseq
