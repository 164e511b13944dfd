#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hetseq/optim/optimizer.h"

namespace hetseq {

/// `--optimizer-overrides key=value,key=value`: hyper-parameters of the optimizer that replace the
/// ones a checkpoint saved (e.g. `beta2=0.98,weight_decay=0.01`). The text is parsed strictly, never
/// evaluated: names of letters, digits and '_', values finite numbers. Throws hetseq::UsageError
/// naming the flag and the bad item. An empty text gives no overrides.
std::vector<std::pair<std::string, double>> parse_optimizer_overrides(const std::string& text);

/// Sets each override on `optimizer`. Throws hetseq::UsageError naming --optimizer-overrides for a
/// name the optimizer does not have or a value out of range.
void apply_optimizer_overrides(optim::Optimizer& optimizer, const std::vector<std::pair<std::string, double>>& overrides);

}  // namespace hetseq
