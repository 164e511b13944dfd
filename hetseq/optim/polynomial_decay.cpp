#include "hetseq/optim/polynomial_decay.h"

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

const PolynomialDecayOptions& validated(const PolynomialDecayOptions& o) {
  if (o.lrs.empty()) throw UsageError("--lr: polynomial_decay needs at least one learning rate");
  for (double lr : o.lrs) {
    if (!std::isfinite(lr) || lr < 0) {
      throw UsageError(fmt::format("--lr: learning rates must be finite numbers >= 0, got {}", lr));
    }
  }
  if (o.warmup_updates < 0) {
    throw UsageError(fmt::format("--warmup-updates: must be >= 0, got {}", o.warmup_updates));
  }
  if (o.total_num_update <= o.warmup_updates) {
    throw UsageError(fmt::format("--total-num-update ({}) must be greater than --warmup-updates ({}) for "
                                 "PolynomialDecayScheduler",
                                 o.total_num_update, o.warmup_updates));
  }
  if (!std::isfinite(o.end_learning_rate) || o.end_learning_rate < 0) {
    throw UsageError(fmt::format("--end-learning-rate: must be a finite number >= 0, got {}", o.end_learning_rate));
  }
  if (!std::isfinite(o.power) || o.power <= 0) {
    throw UsageError(fmt::format("--power: must be a finite number > 0, got {}", o.power));
  }
  if (o.force_anneal && *o.force_anneal < 1) {
    throw UsageError(fmt::format("--force-anneal: must be an epoch >= 1, got {}", *o.force_anneal));
  }
  return o;
}

}  // namespace

PolynomialDecay::PolynomialDecay(Optimizer& optimizer, PolynomialDecayOptions options)
    : WarmupLrScheduler(optimizer, validated(options).lrs.front(), options.warmup_updates), options_(std::move(options)) {}

// See Note [Per-epoch --lr lists].
double PolynomialDecay::get_next_lr(int64_t epoch) const {
  if (!options_.force_anneal || epoch < *options_.force_anneal) {
    const auto last = static_cast<int64_t>(options_.lrs.size()) - 1;
    return options_.lrs[static_cast<size_t>(std::min(epoch, last))];
  }
  return optimizer_.lr();
}

double PolynomialDecay::lr_after_epoch(int64_t epoch) const { return get_next_lr(epoch); }

double PolynomialDecay::step_update(int64_t num_updates) {
  LrScheduler::step_update(num_updates);
  const int64_t warmup = options_.warmup_updates;
  const int64_t total = options_.total_num_update;
  const double end = options_.end_learning_rate;
  double lr;
  if (warmup > 0 && num_updates <= warmup) {
    warmup_factor_ = static_cast<double>(num_updates) / static_cast<double>(warmup);
    lr = warmup_factor_ * lr_;
  } else if (num_updates >= total) {
    lr = end;
  } else {
    const double pct_remaining =
        1.0 - static_cast<double>(num_updates - warmup) / static_cast<double>(total - warmup);
    lr = (lr_ - end) * std::pow(pct_remaining, options_.power) + end;
  }
  optimizer_.set_lr(lr);
  return optimizer_.lr();
}

LrSchedulerSpec polynomial_decay_spec() {
  LrSchedulerSpec spec;
  spec.name = "PolynomialDecayScheduler";
  spec.flags = [](FlagSet& flags) {
    const PolynomialDecayOptions d;
    flags.add("end-learning-rate", "final learning rate (PolynomialDecayScheduler)", flag_text(d.end_learning_rate),
              "LR")
        .add("power", "decay power (PolynomialDecayScheduler)", flag_text(d.power), "P")
        .add("total-num-update", "updates over which the rate decays (PolynomialDecayScheduler)",
             flag_text(d.total_num_update), "N");
  };
  spec.configure = [](const FlagValues& args, const CommonOptimOptions& common) -> LrSchedulerFactory {
    PolynomialDecayOptions o;
    o.lrs = common.lrs;
    o.warmup_updates = common.warmup_updates;
    o.force_anneal = common.force_anneal;
    o.end_learning_rate = args.number("end-learning-rate");
    o.power = args.number("power");
    o.total_num_update = args.integer("total-num-update");
    if (o.total_num_update <= 0) {
      throw UsageError(fmt::format("--total-num-update: {} must be a positive integer", o.total_num_update));
    }
    return [o](Optimizer& optimizer) { return std::make_unique<PolynomialDecay>(optimizer, o); };
  };
  return spec;
}

}  // namespace hetseq::optim
