#include "hetseq/train/training_loop.h"

#include <algorithm>
#include <chrono>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"

namespace hetseq {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The value of statistic `name` among validation `stats`; throws hetseq::UsageError naming
// --best-checkpoint-metric when validation reports no such statistic.
double find_stat(const std::vector<Stat>& stats, const std::string& name) {
  std::vector<std::string> names;
  for (const auto& s : stats) {
    if (s.name == name) return s.value;
    names.push_back(s.name);
  }
  throw UsageError(fmt::format("--best-checkpoint-metric {}: validation reports no such statistic; it reports {}", name,
                               fmt::join(names, ", ")));
}

}  // namespace

TrainingLoop::TrainingLoop(TrainingLoopParts parts, TrainingLoopOptions options)
    : parts_(std::move(parts)),
      options_(std::move(options)),
      compute_clock_([device = options_.device] { return make_compute_timer(device); }) {
  HETSEQ_ASSERT(parts_.controller && parts_.schedule && parts_.train_data, "TrainingLoop built with a null part");
  if (parts_.tracer) parts_.controller->set_tracer(parts_.tracer);
  HETSEQ_ASSERT(options_.disable_validation || parts_.validator, "validation on, but no Validator");
}

bool TrainingLoop::pinned_batches() const { return options_.pin_batches && options_.device.is_cuda(); }

bool TrainingLoop::update_limit_reached() const {
  return options_.max_update > 0 && parts_.controller->num_updates() >= options_.max_update;
}

bool TrainingLoop::limits_reached(double lr, int64_t epoch) const {
  return lr <= options_.min_lr || (options_.max_epoch > 0 && epoch > options_.max_epoch) || update_limit_reached();
}

int64_t TrainingLoop::run(IteratorPosition start) {
  stream_ = std::make_unique<UpdateStream>(
      EpochBatchIterator(parts_.train_data->size(), parts_.schedule->train_plan(start.epoch), options_.order),
      std::make_shared<BatchLoader>(parts_.train_data, BatchLoaderOptions{options_.num_workers, pinned_batches()}),
      // Enough updates ahead to keep every loader thread busy, and at least two, so that a slow collate is
      // hidden behind more than one update (with no threads, batches are collated when needed).
      options_.num_workers > 0 ? std::max<int64_t>(2, options_.num_workers) : 1);
  stream_->restore(start);
  plan_version_ = parts_.schedule->version();
  resumed_inside_epoch_ = start.offset > 0 && options_.continue_epoch_meters;
  log::info("[train] {} training samples, {} samples per update over {} rank(s), {} updates per epoch",
            parts_.train_data->size(), stream_->iterator().plan().samples_per_update(),
            parts_.schedule->world_size(), stream_->iterator().updates_per_epoch());
  double lr = parts_.controller->lr();
  int64_t epoch = start.epoch;
  int64_t last_trained = start.offset > 0 ? start.epoch : start.epoch - 1;
  while (!limits_reached(lr, epoch)) {
    last_trained = epoch;
    if (!train_epoch(epoch)) break;
    lr = end_epoch(epoch);
    ++epoch;
    if (stopping_) {
      // Stopped by the last update of an epoch: the epoch has ended as usual; continue from the next.
      Checkpointer* ck = parts_.checkpointer;
      if (ck && ck->enabled() && !ck->saved_at(parts_.controller->num_updates())) {
        save(epoch - 1, true, IteratorPosition{epoch, 0}, std::nullopt);
      }
      break;
    }
  }
  if (parts_.tracer) parts_.tracer->finish();
  for (const auto& o : observers_) o->on_train_end(last_trained, parts_.controller->num_updates());
  return last_trained;
}

void TrainingLoop::run_update(int64_t epoch, int64_t index, int64_t total) {
  Controller& controller = *parts_.controller;
  follow_plan(epoch);
  if (parts_.tracer) parts_.tracer->begin_update(controller.num_updates() + 1);
  const TraceSpan update_span(parts_.tracer.get(), "update", controller.num_updates() + 1);
  const auto t0 = Clock::now();
  std::vector<Batch> batches;
  {
    const TraceSpan span(parts_.tracer.get(), "data");
    batches = stream_->next();
    if (pinned_batches()) {
      // Each micro-batch on its way to the device, beside the work still queued there (Note [Batches
      // to the device]); the Controller then finds them on the device.
      for (Batch& batch : batches) batch = batch.to(options_.device);
    }
  }
  UpdateRecord record;
  record.times.data_s = seconds_since(t0);
  compute_clock_.start();
  controller.vote_stop((options_.stop_requested && options_.stop_requested()) || (roster_ && roster_->stop_asked()));
  const UpdateResult result = controller.train_update(batches);
  UpdateShape shape{0, static_cast<int64_t>(batches.size())};
  for (const Batch& batch : batches) shape.samples += batch.num_samples;
  const double step_s = compute_clock_.stop(shape);
  if (result.stop_agreed && !stopping_) {
    stopping_ = true;
    log::info("[train] a stop was requested (SIGTERM or SIGINT): stopping after update {}, epoch {}",
              controller.num_updates(), epoch);
  }
  const ReductionTiming& comm = result.reduction;
  record.times.comm_wait_s = comm.exposed_s;
  record.times.comm_busy_s = comm.busy_s;
  record.times.comm_bytes = comm.bytes;
  record.times.compute_s = std::max(0.0, step_s - record.times.comm_wait_s);
  record.times.total_s = seconds_since(t0);
  record.epoch = epoch;
  record.num_updates = controller.num_updates();
  record.index_in_epoch = index;
  record.updates_in_epoch = total;
  record.rank = parts_.schedule->rank();
  record.sample_ids = &stream_->last_indices();
  record.batch_sizes = stream_->iterator().plan().batch_sizes;
  record.shares = stream_->iterator().plan().all_shares();
  record.result = &result;
  for (const auto& o : observers_) o->on_update(record);
}

bool TrainingLoop::train_epoch(int64_t epoch) {
  Controller& controller = *parts_.controller;
  stream_->set_plan(parts_.schedule->train_plan(epoch));
  plan_version_ = parts_.schedule->version();
  stream_->begin_epoch(epoch);
  if (!(first_epoch_ && resumed_inside_epoch_)) controller.reset_epoch_meters();
  first_epoch_ = false;
  for (const auto& o : observers_) o->on_epoch_begin(epoch);
  const int64_t total = stream_->updates_left();
  Checkpointer* ck = parts_.checkpointer;
  for (int64_t i = 1; !stream_->end_of_epoch() && !update_limit_reached() && !stopping_; ++i) {
    const int64_t before = controller.num_updates();
    if (roster_ && roster_->sitting_out()) {
      i = sit_out(epoch);
    } else {
      if (roster_) roster_->before_update();
      run_update(epoch, i, total);
      if (roster_) {
        // Note [Sharing an update]: whether the ranks that sit out are needed after this update.
        const int64_t n = controller.num_updates();
        const bool everyone = stopping_ || stream_->end_of_epoch() || update_limit_reached() ||
                              (ck && ck->due_after_update(n));
        roster_->after_update(controller, Meeting{epoch, n, i, stream_->position(), stopping_}, everyone);
      }
    }
    const bool applied = controller.num_updates() > before;
    if (applied && ck && !stopping_ && !stream_->end_of_epoch() && ck->due_after_update(controller.num_updates())) {
      save(epoch, false, stream_->position(), validate(epoch).metric);
    }
  }
  std::vector<Stat> stats = controller.train_stats();
  for (const auto& o : observers_) o->add_epoch_stats(epoch, stats);
  for (const auto& o : observers_) o->on_epoch_end(epoch, stats);
  if (stream_->end_of_epoch()) return true;
  // Stopped inside the epoch (--max-update, or a stop signal): a checkpoint to continue from. A stop
  // does not validate first: the supervisor's grace period is short (Note [Clean stops]). A run that
  // reached --max-update validates its last update, with or without a save (--no-save), unless an
  // interval save at this very update already did.
  const bool saved_here = ck && ck->enabled() && ck->saved_at(controller.num_updates());
  if (saved_here) return false;
  std::optional<double> metric;
  if (!stopping_) metric = validate(epoch).metric;
  if (ck && ck->enabled()) save(epoch, false, stream_->position(), metric);
  return false;
}

void TrainingLoop::follow_plan(int64_t epoch) {
  if (parts_.schedule->version() == plan_version_) return;
  // A new split (see Note [Plan schedule]): the next update's samples are the same, cut anew.
  stream_->set_plan(parts_.schedule->train_plan(epoch));
  plan_version_ = parts_.schedule->version();
}

int64_t TrainingLoop::sit_out(int64_t epoch) {
  const Meeting m = roster_->wait(*parts_.controller);
  HETSEQ_ASSERT(m.epoch == epoch, "called to a meeting in epoch {} while sitting out epoch {}", m.epoch, epoch);
  follow_plan(epoch);  // the call's split
  stream_->restore(m.next);
  if (m.stop && !stopping_) {
    stopping_ = true;
    log::info("[train] a stop was requested (SIGTERM or SIGINT): stopping after update {}, epoch {}", m.num_updates,
              epoch);
  }
  return m.index_in_epoch;
}

TrainingLoop::Validation TrainingLoop::validate(int64_t epoch) {
  Validation v;
  if (options_.disable_validation) return v;
  Controller& controller = *parts_.controller;
  const TraceSpan span(parts_.tracer.get(), "validate");
  if (parts_.schedule) parts_.validator->set_plan(parts_.schedule->valid_plan(epoch));
  for (const auto& split : options_.valid_subsets) {
    const LogSums sums = parts_.validator->run(parts_.valid_data.at(split), controller.model());
    const std::vector<Stat> stats = parts_.validator->stats(sums, controller.num_updates());
    for (const auto& o : observers_) o->on_validation(epoch, split, stats);
    if (v.loss) continue;
    v.loss = stats.front().value;
    v.metric = find_stat(stats, options_.best_checkpoint_metric);
  }
  return v;
}

double TrainingLoop::end_epoch(int64_t epoch) {
  Validation v;
  if (epoch % options_.validate_interval == 0) v = validate(epoch);
  const double lr = parts_.controller->lr_step(epoch, v.loss);
  if (parts_.checkpointer && parts_.checkpointer->due_after_epoch(epoch)) {
    save(epoch, true, IteratorPosition{epoch + 1, 0}, v.metric);
  }
  return lr;
}

void TrainingLoop::save(int64_t epoch, bool end_of_epoch, IteratorPosition next, std::optional<double> metric) {
  const TraceSpan span(parts_.tracer.get(), "checkpoint");
  const SavePoint point{epoch, parts_.controller->num_updates(), end_of_epoch, metric};
  parts_.checkpointer->save(*parts_.controller, point, next, parts_.schedule->train_plan(epoch));
}

}  // namespace hetseq
