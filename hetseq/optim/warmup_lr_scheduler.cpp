#include "hetseq/optim/warmup_lr_scheduler.h"

#include <cmath>

#include "hetseq/core/error.h"

namespace hetseq::optim {

WarmupLrScheduler::WarmupLrScheduler(Optimizer& optimizer, double first_lr, int64_t warmup_updates)
    : LrScheduler(optimizer),
      lr_(first_lr),
      warmup_factor_(warmup_updates > 0 ? 1.0 / static_cast<double>(warmup_updates) : 1.0) {
  optimizer_.set_lr(warmup_factor_ * lr_);
}

double WarmupLrScheduler::step(int64_t epoch, std::optional<double> val_loss) {
  LrScheduler::step(epoch, val_loss);
  lr_ = lr_after_epoch(epoch);
  optimizer_.set_lr(warmup_factor_ * lr_);
  return optimizer_.lr();
}

std::map<std::string, double> WarmupLrScheduler::state() const {
  auto out = LrScheduler::state();
  out["lr"] = lr_;
  out["warmup_factor"] = warmup_factor_;
  return out;
}

void WarmupLrScheduler::load_state(const std::map<std::string, double>& state) {
  const double lr = required_entry(state, "lr");
  const double warmup_factor = required_entry(state, "warmup_factor");
  if (!std::isfinite(lr) || lr < 0 || !(warmup_factor >= 0 && warmup_factor <= 1)) {
    throw InputError(fmt::format("lr scheduler '{}': cannot load its state: lr {} or warmup_factor {} is out of "
                                 "range; the checkpoint is corrupt",
                                 name(), lr, warmup_factor));
  }
  LrScheduler::load_state(state);
  lr_ = lr;
  warmup_factor_ = warmup_factor;
}

}  // namespace hetseq::optim
