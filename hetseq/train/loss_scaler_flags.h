#pragma once
/// The flags of LossScalerOptions (--fp16's dynamic loss scaling), declared beside the struct: their
/// defaults are the struct's. hetseq-train shows them in its "Mixed precision" group.

#include "hetseq/core/flag_set.h"
#include "hetseq/train/loss_scaler.h"

namespace hetseq {

/// Declares --fp16-init-scale, --fp16-scale-tolerance, --min-loss-scale and --threshold-loss-scale in
/// `flags`, with `defaults`' values as their defaults. The window (--fp16-scale-window) is the
/// session's, whose default depends on the split: MixedPrecisionOptions::scale_window.
void declare_loss_scaler_flags(FlagSet& flags, const LossScalerOptions& defaults = {});

/// The names that declare_loss_scaler_flags declares.
const std::vector<std::string>& loss_scaler_flag_names();

/// Reads those flags (not validated: LossScalerOptions::validate, once --fp16 is known to be on).
/// Throws hetseq::UsageError naming the flag on a malformed number.
LossScalerOptions read_loss_scaler_options(const FlagValues& values);

}  // namespace hetseq
