#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace hetseq {

/// A weighted running average (loss per sample, batch size, gradient norm, ...).
class AverageMeter {
 public:
  void reset() { sum_ = 0; count_ = 0; last_ = 0; }
  /// Adds `value` with weight `n`.
  void update(double value, double n = 1) { last_ = value; sum_ += value * n; count_ += n; }
  double avg() const { return count_ > 0 ? sum_ / count_ : 0; }
  double last() const { return last_; }
  double sum() const { return sum_; }
  double count() const { return count_; }
  /// Continues from a saved sum(), count() and last() (resume).
  void restore(double sum, double count, double last) { sum_ = sum; count_ = count; last_ = last; }

 private:
  double sum_ = 0, count_ = 0, last_ = 0;
};

/// Counts events per second of wall time since the last reset (updates/s, words/s).
class RateMeter {
 public:
  RateMeter() { reset(); }
  void reset() { start_ = Clock::now(); n_ = 0; }
  void update(double n) { n_ += n; }
  /// Events per second since the last reset.
  double rate() const;
  double elapsed_s() const;
  double count() const { return n_; }
  /// Continues as if `n` events had been counted over the last `elapsed_s` seconds (resume).
  void restore(double n, double elapsed_s);

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
  double n_ = 0;
};

/// Accumulates time between start() and stop() (train_wall).
class StopwatchMeter {
 public:
  void start() { start_ = Clock::now(); running_ = true; }
  void stop();
  void reset() { sum_s_ = 0; running_ = false; }
  double sum_s() const { return sum_s_; }
  /// Continues from a saved sum_s() (resume); stopped.
  void restore(double sum_s) { sum_s_ = sum_s; running_ = false; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
  double sum_s_ = 0;
  bool running_ = false;
};

/// The training meters of one run, by the names they are logged under. See hetseq/train/controller.h
/// for what updates them.
struct TrainMeters {
  AverageMeter loss, nll_loss;  // base 2, per sample_size / ntokens
  AverageMeter wpb, bsz;        // words (tokens) and sentences per batch (update)
  AverageMeter gnorm, clip;     // gradient norm before clipping; fraction of clipped updates
  RateMeter wps, ups;           // tokens/s, updates/s
  StopwatchMeter train_wall;    // time spent in updates
  RateMeter wall;               // since the run started

  /// Resets the per-epoch meters (all but wall and train_wall).
  void reset_epoch();
  /// All meters as named numbers (`loss.sum`, `wps.n`, `wall.elapsed_s`, ...), for checkpoints.
  std::map<std::string, double> state() const;
  /// Restores a state(); names it lacks leave their meter as it is.
  void load_state(const std::map<std::string, double>& state);
};

}  // namespace hetseq
