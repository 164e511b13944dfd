#include "hetseq/session/precision_flags.h"

#include "hetseq/core/error.h"
#include "hetseq/core/flag_text.h"
#include "hetseq/train/loss_scaler_flags.h"

namespace hetseq {

void declare_precision_flags(FlagSet& flags, const MixedPrecisionOptions& d) {
  flags.add_switch("fp16", "forward passes in float16 (autocast) with dynamic loss scaling; weights, gradients and "
                   "optimizer stay float32 (alias --memory-efficient-fp16)", d.precision == Precision::kFloat16)
      .add_switch("bf16", "forward passes in bfloat16 (autocast), on CUDA or the CPU; no loss scaling needed",
                  d.precision == Precision::kBFloat16);
  declare_loss_scaler_flags(flags, d.scaler);
  const std::string window_help = "updates without overflow before the loss scale doubles (default: 16384 / "
                                  "micro-batches per update over all ranks)";
  if (d.scale_window) {
    flags.add("fp16-scale-window", window_help, flag_text(*d.scale_window));
  } else {
    flags.add_optional("fp16-scale-window", window_help);
  }
}

MixedPrecisionOptions read_precision_options(const FlagValues& values) {
  MixedPrecisionOptions m;
  const bool fp16 = values.flag("fp16"), bf16 = values.flag("bf16");
  if (fp16 && bf16) throw UsageError("--fp16 and --bf16 exclude each other; pick one");
  m.precision = fp16 ? Precision::kFloat16 : bf16 ? Precision::kBFloat16 : Precision::kFloat32;
  std::vector<std::string> scaling = loss_scaler_flag_names();
  scaling.push_back("fp16-scale-window");
  for (const std::string& name : scaling) {
    if (!fp16 && values.given(name)) {
      throw UsageError(fmt::format("--{} sets the loss scaling of --fp16; add --fp16 or leave it out", name));
    }
  }
  m.scaler = read_loss_scaler_options(values);
  if (values.has("fp16-scale-window")) m.scale_window = values.positive("fp16-scale-window");
  if (fp16) m.scaler.validate();
  return m;
}

}  // namespace hetseq
