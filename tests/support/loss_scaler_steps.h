#pragma once
// Small helpers of the loss scaler's tests (test_loss_scaling.cpp, test_loss_scaler_state.cpp).

#include <cstdint>
#include <vector>

#include "hetseq/train/loss_scaler.h"

namespace hetseq::test {

/// Scaler options with initial scale `init` and `--fp16-scale-window` `window`, the rest their defaults.
inline LossScalerOptions scaler_options(double init, int64_t window) {
  LossScalerOptions o;
  o.init_scale = init;
  o.scale_window = window;
  return o;
}

/// Feeds `overflows` (1: overflow) to `scaler` and returns the scale after each.
inline std::vector<double> scales_after(DynamicLossScaler& scaler, const std::vector<int>& overflows) {
  std::vector<double> out;
  for (int o : overflows) {
    scaler.update(o != 0);
    out.push_back(scaler.scale());
  }
  return out;
}

}  // namespace hetseq::test
