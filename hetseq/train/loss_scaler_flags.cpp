#include "hetseq/train/loss_scaler_flags.h"

#include "hetseq/core/flag_text.h"

namespace hetseq {

void declare_loss_scaler_flags(FlagSet& flags, const LossScalerOptions& d) {
  flags.add("fp16-init-scale", "initial loss scale of --fp16, a power of two", flag_text(d.init_scale))
      .add("fp16-scale-tolerance", "share of overflowing updates tolerated before the loss scale halves",
           flag_text(d.tolerance))
      .add("min-loss-scale", "stop with an error when the loss scale falls below this", flag_text(d.min_scale));
  if (d.threshold) {
    flags.add("threshold-loss-scale", "the loss scale never halves below this (a power of two)",
              flag_text(*d.threshold));
  } else {
    flags.add_optional("threshold-loss-scale", "the loss scale never halves below this (a power of two)");
  }
}

const std::vector<std::string>& loss_scaler_flag_names() {
  static const std::vector<std::string> names{"fp16-init-scale", "fp16-scale-tolerance", "min-loss-scale",
                                              "threshold-loss-scale"};
  return names;
}

LossScalerOptions read_loss_scaler_options(const FlagValues& values) {
  LossScalerOptions o;
  o.init_scale = values.number("fp16-init-scale");
  o.tolerance = values.number("fp16-scale-tolerance");
  o.min_scale = values.number("min-loss-scale");
  if (values.has("threshold-loss-scale")) o.threshold = values.number("threshold-loss-scale");
  return o;
}

}  // namespace hetseq
