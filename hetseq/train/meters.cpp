#include "hetseq/train/meters.h"

namespace hetseq {

double RateMeter::elapsed_s() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

double RateMeter::rate() const {
  const double s = elapsed_s();
  return s > 0 ? n_ / s : 0;
}

void StopwatchMeter::stop() {
  if (!running_) return;
  sum_s_ += std::chrono::duration<double>(Clock::now() - start_).count();
  running_ = false;
}

void TrainMeters::reset_epoch() {
  loss.reset();
  nll_loss.reset();
  wpb.reset();
  bsz.reset();
  gnorm.reset();
  clip.reset();
  wps.reset();
  ups.reset();
}

}  // namespace hetseq
