#pragma once
/// The default of --clip-norm, for the two option structs that carry it: the session's
/// (OptimizationOptions, what the command line fills) and the Controller's (ControllerOptions, what the
/// session hands on). Declared once here (Note [One declaration per flag]).

namespace hetseq {

/// The largest global gradient norm before the gradients are scaled down to it (fairseq's 25); 0 turns
/// clipping off.
inline constexpr double kDefaultClipNorm = 25;

}  // namespace hetseq
