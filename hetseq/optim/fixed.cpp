#include "hetseq/optim/fixed.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "hetseq/core/format.h"

#include "hetseq/core/error.h"
#include "hetseq/optim/registry.h"
#include "hetseq/core/parse.h"
#include "hetseq/core/flag_text.h"

namespace hetseq::optim {

namespace {

const FixedOptions& validated(const FixedOptions& o) {
  if (o.lrs.empty()) throw UsageError("--lr: the fixed schedule needs at least one learning rate");
  for (double lr : o.lrs) {
    if (!std::isfinite(lr) || lr < 0) {
      throw UsageError(fmt::format("--lr: learning rates must be finite numbers >= 0, got {}", lr));
    }
  }
  if (!std::isfinite(o.lr_shrink) || o.lr_shrink < 0) {
    throw UsageError(fmt::format("--lr-shrink: must be a finite number >= 0, got {}", o.lr_shrink));
  }
  if (o.warmup_updates < 0) {
    throw UsageError(fmt::format("--warmup-updates: must be >= 0, got {}", o.warmup_updates));
  }
  if (o.force_anneal && *o.force_anneal < 1) {
    throw UsageError(fmt::format("--force-anneal: must be an epoch >= 1, got {}", *o.force_anneal));
  }
  return o;
}

}  // namespace

Fixed::Fixed(Optimizer& optimizer, FixedOptions options)
    : WarmupLrScheduler(optimizer, validated(options).lrs.front(), options.warmup_updates), options_(std::move(options)) {}

// The lr of epoch `epoch` (1-based), about to begin. See Note [Per-epoch --lr lists].
double Fixed::get_next_lr(int64_t epoch) const {
  if (!options_.force_anneal || epoch < *options_.force_anneal) {
    const auto last = static_cast<int64_t>(options_.lrs.size()) - 1;
    return options_.lrs[static_cast<size_t>(std::clamp<int64_t>(epoch - 1, 0, last))];
  }
  const auto exponent = static_cast<double>(epoch + 1 - *options_.force_anneal);
  return options_.lrs.back() * std::pow(options_.lr_shrink, exponent);
}

double Fixed::lr_after_epoch(int64_t epoch) const { return get_next_lr(epoch + 1); }

double Fixed::step_update(int64_t num_updates) {
  LrScheduler::step_update(num_updates);
  const int64_t warmup = options_.warmup_updates;
  if (warmup > 0 && num_updates < warmup) {
    warmup_factor_ = static_cast<double>(num_updates + 1) / static_cast<double>(warmup);
  } else {
    // fairseq leaves the factor at its last warmup value, which is 1 when every update was stepped;
    // setting it here also holds when training resumes past the warmup.
    warmup_factor_ = 1.0;
  }
  optimizer_.set_lr(warmup_factor_ * lr_);
  return optimizer_.lr();
}

LrSchedulerSpec fixed_spec() {
  LrSchedulerSpec spec;
  spec.name = "fixed";
  spec.flags = [](FlagSet& flags) {
    flags.add("lr-shrink", "learning rate shrink factor after --force-anneal (fixed)",
              flag_text(FixedOptions{}.lr_shrink), "F");
  };
  spec.configure = [](const FlagValues& args, const CommonOptimOptions& common) -> LrSchedulerFactory {
    FixedOptions o;
    o.lrs = common.lrs;
    o.force_anneal = common.force_anneal;
    o.lr_shrink = args.number("lr-shrink");
    o.warmup_updates = common.warmup_updates;
    return [o](Optimizer& optimizer) { return std::make_unique<Fixed>(optimizer, o); };
  };
  return spec;
}

}  // namespace hetseq::optim
