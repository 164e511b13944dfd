#include "hetseq/optim/inverse_sqrt.h"

#include <cmath>

#include "hetseq/core/format.h"

#include "hetseq/core/error.h"
#include "hetseq/optim/registry.h"
#include "hetseq/core/parse.h"

namespace hetseq::optim {

namespace {

void validate(const InverseSqrtOptions& o) {
  if (o.lrs.size() != 1) {
    throw UsageError(fmt::format("--lr: inverse_sqrt takes exactly one learning rate, got {} ({}); use the "
                                 "fixed schedule for a per-epoch list",
                                 o.lrs.size(), fmt::join(o.lrs, ",")));
  }
  if (!std::isfinite(o.lrs[0]) || o.lrs[0] < 0) {
    throw UsageError(fmt::format("--lr: the learning rate must be a finite number >= 0, got {}", o.lrs[0]));
  }
  // fairseq divides by the warmup (lr_step) and scales the decay by sqrt(warmup), so 0 cannot work.
  if (o.warmup_updates < 1) {
    throw UsageError(fmt::format("--warmup-updates: inverse_sqrt needs at least 1 warmup update, got {}",
                                 o.warmup_updates));
  }
  if (o.warmup_init_lr && (!std::isfinite(*o.warmup_init_lr) || *o.warmup_init_lr < 0)) {
    throw UsageError(fmt::format("--warmup-init-lr: must be a finite number >= 0, got {}", *o.warmup_init_lr));
  }
}

}  // namespace

InverseSqrt::InverseSqrt(Optimizer& optimizer, InverseSqrtOptions options) : LrScheduler(optimizer) {
  validate(options);
  const double lr = options.lrs[0];
  warmup_updates_ = options.warmup_updates;
  warmup_init_lr_ = options.warmup_init_lr.value_or(0.0);
  lr_step_ = (lr - warmup_init_lr_) / static_cast<double>(warmup_updates_);
  decay_factor_ = lr * std::sqrt(static_cast<double>(warmup_updates_));
  optimizer_.set_lr(warmup_init_lr_);
}

double InverseSqrt::step_update(int64_t num_updates) {
  LrScheduler::step_update(num_updates);
  const double lr = num_updates < warmup_updates_
                        ? warmup_init_lr_ + static_cast<double>(num_updates) * lr_step_
                        : decay_factor_ / std::sqrt(static_cast<double>(num_updates));
  optimizer_.set_lr(lr);
  return optimizer_.lr();
}

LrSchedulerSpec inverse_sqrt_spec() {
  LrSchedulerSpec spec;
  spec.name = "inverse_sqrt";
  spec.flags = [](FlagSet& flags) {
    flags.add_optional("warmup-init-lr", "initial learning rate of the warmup (inverse_sqrt)", "LR");
  };
  spec.configure = [](const FlagValues& args, const CommonOptimOptions& common) -> LrSchedulerFactory {
    InverseSqrtOptions o;
    o.lrs = common.lrs;
    // --warmup-updates is every schedule's flag, 0 by default; inverse_sqrt cannot start from 0, and
    // takes its own default (InverseSqrtOptions, fairseq's 4000) unless the flag is given.
    if (args.given("warmup-updates")) o.warmup_updates = common.warmup_updates;
    if (args.has("warmup-init-lr")) o.warmup_init_lr = args.number("warmup-init-lr");
    return [o](Optimizer& optimizer) { return std::make_unique<InverseSqrt>(optimizer, o); };
  };
  return spec;
}

}  // namespace hetseq::optim
