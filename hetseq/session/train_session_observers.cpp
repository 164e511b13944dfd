// The observers of a TrainSession's loop: progress, sample ids, step profile, the balancer (and the
// roster of ranks that sit out) and the per-rank summary.
#include <unistd.h>

#include "hetseq/balance/rank_summary.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/stop_request.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/session/train_session.h"
#include "hetseq/train/progress_observer.h"
#include "hetseq/train/sample_id_observer.h"
#include "hetseq/train/step_profile.h"

namespace hetseq {

GatherFn TrainSession::gather_figures() const {
  return [channel = channel_](const std::vector<double>& local) { return channel->gather(local); };
}

void TrainSession::add_observers() {
  const bool rank0 = world_.rank() == 0;
  progress_ = std::make_unique<ProgressLogger>(rank0 ? o_.common.log_format : LogFormat::kNone,
                                               rank0 && !o_.common.no_progress_bar && ::isatty(fileno(stdout)),
                                               o_.common.log_interval);
  for (const auto& sink : sinks_) progress_->add_sink(sink);
  loop_->add_observer(std::make_shared<ProgressObserver>(*progress_, *controller_));
  if (o_.checkpoint.dump_sample_ids) {
    loop_->add_observer(std::make_shared<SampleIdObserver>(*o_.checkpoint.dump_sample_ids, world_.rank()));
  }
  add_balancer();
  if (o_.observe.step_profile_timed > 0) {
    StepProfileOptions p;
    p.warmup = o_.observe.step_profile_warmup;
    p.timed = o_.observe.step_profile_timed;
    p.device = world_.device();
    p.rank = world_.rank();
    loop_->add_observer(std::make_shared<StepProfile>(p));
  }
  if (world_.distributed()) {
    RankSummaryOptions r;
    r.log_interval = o_.common.log_interval;
    r.log_all_ranks = o_.distributed.log_all_ranks;
    r.world_size = world_.world_size();
    if (world_.device().is_cuda() && world_.rank() == 0) {
      log::info("[ranks] on CUDA the per-rank wait and bus bandwidth are timed on the host, where a NCCL allreduce "
                "completes when it is enqueued: the wait reads low and the bandwidth high (the trace's device rows "
                "time them on the GPU)");
    }
    loop_->add_observer(std::make_shared<RankSummary>(roster_ ? roster_->gather(false) : gather_figures(),
                                                      *progress_, balancer_.get(), r));
  }
}

// Why no rank may sit out in this run (Note [Sharing an update]), or "" where ranks may.
std::string TrainSession::sit_out_refused() const {
  if (!o_.balance.auto_balance || !world_.distributed()) return "no --auto-balance";
  if (sharding_.steps_shards()) return "--zero-sharding: every rank steps its shard";
  if (o_.distributed.ddp.find_unused_parameters) return "--find-unused-parameters: every rank counts the used ones";
  if (o_.distributed.ddp.comm_hook == CommHook::kPowerSgd) return "--ddp-comm-hook powersgd: every rank keeps feedback";
  if (!std::dynamic_pointer_cast<DistributedReducer>(reducer_)) return "no distributed reducer";
  return "";
}

// The balancer watches every distributed run: with --auto-balance it moves the split, without it it
// reports the epoch's balance and suggests --auto-balance when that would gain.
void TrainSession::add_balancer() {
  if (!world_.distributed()) {
    if (o_.balance.auto_balance) log::info("[balance] one rank: --auto-balance has nothing to balance");
    return;
  }
  BalanceOptions b;
  b.enabled = o_.balance.auto_balance;
  b.interval = o_.balance.interval;
  b.threshold = o_.balance.threshold;
  b.widen_to_noise = !o_.balance.threshold_given;
  b.caps = balance_caps_;
  b.multiple = o_.dataset.required_batch_size_multiple;
  const std::string why_not = sit_out_refused();
  if (b.enabled && why_not.empty()) {
    SitOutOptions so;
    so.timeout = o_.distributed.world.timeout;
    so.fast_stat_sync = o_.distributed.fast_stat_sync;
    so.host_group = stats_on_host_group_;
    so.stop_requested = [] { return stop_request::requested(); };
    roster_ = std::make_shared<SitOutRoster>(world_, *schedule_, std::dynamic_pointer_cast<DistributedReducer>(reducer_),
                                             channel_, train_data_, so);
    b.sit_out = true;
  } else if (b.enabled && world_.rank() == 0) {
    log::info("[balance] no rank sits out in this run: {}", why_not);
  }
  balancer_ = std::make_shared<AutoBalancer>(*schedule_, roster_ ? roster_->gather(true) : gather_figures(), b);
  loop_->add_observer(balancer_);
  if (roster_) {
    roster_->set_balancer(balancer_.get());
    loop_->set_roster(roster_);
  }
  if (b.enabled && world_.rank() == 0) {
    log::info("[balance] auto-balance on: re-plan every {} updates, threshold {:.0f}%{}, caps [{}] (0: none)",
              b.interval, 100 * b.threshold, b.widen_to_noise ? " or twice the measured noise" : "",
              fmt::join(b.caps, ","));
  }
}

}  // namespace hetseq
