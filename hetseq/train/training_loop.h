#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hetseq/train/checkpointer.h"
#include "hetseq/data/batch_loader.h"
#include "hetseq/data/plan_schedule.h"
#include "hetseq/observe/compute_timer.h"
#include "hetseq/observe/tracer.h"
#include "hetseq/train/controller.h"
#include "hetseq/train/update_roster.h"
#include "hetseq/train/training_observer.h"
#include "hetseq/train/validator.h"

namespace hetseq {

/// When training stops, what it validates and how it walks the data.
struct TrainingLoopOptions {
  int64_t max_epoch = 0;    // --max-epoch (0: no limit)
  int64_t max_update = 0;   // --max-update (0: no limit)
  double min_lr = -1;       // --min-lr: stop when the learning rate falls to it
  std::vector<std::string> valid_subsets{"valid"};  // --valid-subset
  int64_t validate_interval = 1;                    // --validate-interval (epochs)
  bool disable_validation = false;                  // --disable-validation
  std::string best_checkpoint_metric = "loss";      // --best-checkpoint-metric (of the first subset)
  EpochIteratorOptions order;                       // --seed, --curriculum
  int64_t num_workers = 1;                          // --num-workers
  /// The rank's device (the Controller's): it picks the compute timer (Note [Compute timing]) and, on
  /// CUDA, how batches travel (pin_batches).
  torch::Device device = torch::kCPU;
  /// On a CUDA device: collate into pinned memory and send each update's micro-batches to the device on
  /// a side stream as soon as they are there (Note [Batches to the device]). False: each micro-batch is
  /// copied by the Controller on the compute stream. Ignored on a CPU device, where nothing is pinned.
  bool pin_batches = true;
  /// A run resumed inside an epoch continues that epoch's meters (false with --reset-meters).
  bool continue_epoch_meters = true;
  /// Whether this rank was asked to stop (SIGTERM, SIGINT); null: never. Read before every update,
  /// agreed over the ranks with the update's statistics. See Note [Clean stops].
  std::function<bool()> stop_requested;
};

/// The data and the parts one rank trains with.
struct TrainingLoopParts {
  Controller* controller = nullptr;
  PlanSchedule* schedule = nullptr;        // the split may change between updates (set_split)
  std::shared_ptr<Dataset> train_data;
  std::map<std::string, std::shared_ptr<Dataset>> valid_data;  // [split]; empty without validation
  Validator* validator = nullptr;          // null without validation
  Checkpointer* checkpointer = nullptr;    // null: never save
  /// Null: no timeline (--trace-dir). The one way in for the tracer: the loop hands it to the Controller,
  /// which hands it to its reducer and channel. See Note [Tracing].
  std::shared_ptr<Tracer> tracer;
};

/// The epoch loop, with fairseq's split into train_epoch, validate and end_epoch: trains until
/// --max-epoch, --max-update or --min-lr, validates on --valid-subset, saves through the
/// Checkpointer, and tells its observers about every update, epoch end and validation. Every rank
/// runs it in lockstep. A program that links the library runs the same loop with its own task.
class TrainingLoop {
 public:
  TrainingLoop(TrainingLoopParts parts, TrainingLoopOptions options);

  void add_observer(std::shared_ptr<TrainingObserver> observer) { observers_.push_back(std::move(observer)); }
  /// Which ranks take part in each update, where ranks may sit out (Note [Sharing an update]); none: all.
  void set_roster(std::shared_ptr<UpdateRoster> roster) { roster_ = std::move(roster); }

  /// Trains from `start` (a fresh run: epoch 1, offset 0; a resumed one: the checkpoint's position)
  /// until a limit is reached. Returns the last epoch trained.
  int64_t run(IteratorPosition start);
  /// Whether run() ended because the ranks agreed to stop (see Note [Clean stops]); checkpoint_last.pt
  /// then holds the last finished update.
  bool stopped() const { return stopping_; }

  /// Trains the updates of `epoch` that remain (all of them, or up to --max-update). Returns true when
  /// the epoch was trained to its end.
  bool train_epoch(int64_t epoch);
  /// Validates every --valid-subset; returns the first subset's loss and --best-checkpoint-metric.
  struct Validation {
    std::optional<double> loss, metric;
  };
  Validation validate(int64_t epoch);
  /// The end of a whole epoch: validation (every --validate-interval epochs), the LR schedule's epoch
  /// step and the epoch's checkpoint. Returns the next epoch's learning rate.
  double end_epoch(int64_t epoch);

 private:
  bool pinned_batches() const;        // see TrainingLoopOptions::pin_batches
  bool update_limit_reached() const;  // --max-update
  bool limits_reached(double lr, int64_t epoch) const;
  /// Cuts the coming updates by the schedule's split when it changed since the stream's plan.
  void follow_plan(int64_t epoch);
  /// A rank that sits out: waits until the ranks that train call it, then stands where they stand.
  /// Returns the index in the epoch of the update they met after.
  int64_t sit_out(int64_t epoch);
  void save(int64_t epoch, bool end_of_epoch, IteratorPosition next, std::optional<double> metric);
  void run_update(int64_t epoch, int64_t index, int64_t total);

  TrainingLoopParts parts_;
  TrainingLoopOptions options_;
  std::vector<std::shared_ptr<TrainingObserver>> observers_;
  std::shared_ptr<UpdateRoster> roster_;
  std::unique_ptr<UpdateStream> stream_;
  UpdateComputeClock compute_clock_;  // each update's compute time for the observers (Note [Compute timing])
  int64_t plan_version_ = -1;  // the PlanSchedule version the stream follows
  bool first_epoch_ = true;
  bool stopping_ = false;  // the ranks agreed to stop after the last update
  bool resumed_inside_epoch_ = false;
};

}  // namespace hetseq
