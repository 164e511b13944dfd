#include "hetseq/train/meters.h"

#include <array>
#include <utility>

namespace hetseq {

double RateMeter::elapsed_s() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

double RateMeter::rate() const {
  const double s = elapsed_s();
  return s > 0 ? n_ / s : 0;
}

void RateMeter::restore(double n, double elapsed_s) {
  n_ = n;
  start_ = Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(elapsed_s));
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

namespace {

double get(const std::map<std::string, double>& state, const std::string& key, double fallback) {
  auto it = state.find(key);
  return it == state.end() ? fallback : it->second;
}

// The average meters of `m` by the names their state is saved under.
template <class Meters>
auto averages(Meters& m) {
  return std::array<std::pair<const char*, decltype(&m.loss)>, 6>{
      {{"loss", &m.loss}, {"nll_loss", &m.nll_loss}, {"wpb", &m.wpb}, {"bsz", &m.bsz}, {"gnorm", &m.gnorm},
       {"clip", &m.clip}}};
}

}  // namespace

std::map<std::string, double> TrainMeters::state() const {
  std::map<std::string, double> out;
  for (const auto& [name, m] : averages(*this)) {
    out[std::string(name) + ".sum"] = m->sum();
    out[std::string(name) + ".count"] = m->count();
    out[std::string(name) + ".last"] = m->last();
  }
  out["wps.n"] = wps.count();
  out["wps.elapsed_s"] = wps.elapsed_s();
  out["ups.n"] = ups.count();
  out["ups.elapsed_s"] = ups.elapsed_s();
  out["train_wall.sum_s"] = train_wall.sum_s();
  out["wall.elapsed_s"] = wall.elapsed_s();
  return out;
}

void TrainMeters::load_state(const std::map<std::string, double>& state) {
  for (const auto& [name, m] : averages(*this)) {
    const std::string n(name);
    m->restore(get(state, n + ".sum", m->sum()), get(state, n + ".count", m->count()),
               get(state, n + ".last", m->last()));
  }
  wps.restore(get(state, "wps.n", wps.count()), get(state, "wps.elapsed_s", wps.elapsed_s()));
  ups.restore(get(state, "ups.n", ups.count()), get(state, "ups.elapsed_s", ups.elapsed_s()));
  train_wall.restore(get(state, "train_wall.sum_s", train_wall.sum_s()));
  wall.restore(0, get(state, "wall.elapsed_s", wall.elapsed_s()));
}

}  // namespace hetseq
