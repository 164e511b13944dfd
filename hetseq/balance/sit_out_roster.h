#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "hetseq/balance/auto_balancer.h"
#include "hetseq/data/dataset.h"
#include "hetseq/data/plan_schedule.h"
#include "hetseq/channel/collective_channel.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/world/world.h"
#include "hetseq/train/update_roster.h"

namespace hetseq {

/// How a rank that sits out is measured and how long it waits (Note [Sharing an update]).
struct SitOutOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // --distributed-timeout: rank 0 unheard that long
  std::chrono::milliseconds poll{20};                          // how often a rank that sits out looks for a call
  double probe_s = 0.2;       // one probe: micro-batches back to back for at least this long
  double probe_spacing = 20;  // probes at most every probe_spacing times the last probe's length (at least 1 s)
  bool fast_stat_sync = false;  // --fast-stat-sync, for the channels of the ranks that take part
  /// Whether the channels send the host's part on a host group (World::host_group): where any rank is on a GPU,
  /// as the world's channel does (Note [Stat sync]).
  bool host_group = false;
  /// Whether this process was asked to stop (SIGTERM, SIGINT): a rank that sits out passes it on to rank 0
  /// while it waits (Note [A stop while sitting out]).
  std::function<bool()> stop_requested;
};

/// The UpdateRoster of a balanced run (Note [Sharing an update]): the ranks with a share of 0 in the split in
/// force sit out the updates; the others run them over a process group of their own (World::subgroup), with
/// the gradient reducer and the Controller's channel switched to it. A rank that sits out probes itself now
/// and then and posts its figures on the store, where rank 0 reads them for the balancer; it is called back
/// through the store when every rank is needed (a save, the epoch's end, a stop, a split that takes it back)
/// and then takes rank 0's state, so it stands where the others stand.
class SitOutRoster final : public UpdateRoster {
 public:
  /// Every rank builds one at the same point; ranks at 0 in the schedule's plan (a resumed split) sit out from
  /// this process's third update on (until then they run empty micro-batches). `reducer` must support sitting
  /// out (DistributedReducer::sits_out_supported).
  SitOutRoster(World& world, PlanSchedule& schedule, std::shared_ptr<DistributedReducer> reducer,
               std::shared_ptr<CollectiveChannel> channel, std::shared_ptr<Dataset> train_data,
               SitOutOptions options);

  /// The balancer whose figures a rank that sits out posts and whose window its probes feed.
  void set_balancer(AutoBalancer* balancer) { balancer_ = balancer; }
  /// A GatherFn for the observers: over every rank when all are there, else over the ranks that take part,
  /// with zeros for those that sit out, or (`posted`: the balancer's figures) what they posted last.
  GatherFn gather(bool posted);

  bool sitting_out() const override { return position_ < 0; }
  void before_update() override;
  void after_update(Controller& controller, const Meeting& here, bool everyone) override;
  Meeting wait(Controller& controller) override;
  bool stop_asked() override { return stop_heard_; }

 private:
  std::vector<int64_t> members_of(int64_t epoch) const;
  bool is_member(int64_t rank) const;
  std::shared_ptr<CollectiveChannel> channel_of(const std::vector<int64_t>& members);
  void apply(Controller& controller, const std::vector<int64_t>& members);
  /// Every rank: rank 0's training state to the ranks that sat out (`receiving`). One broadcast.
  void meet(Controller& controller, bool receiving);
  void post_figures();
  /// Rank 0, after an update about once a second while some rank sits out: beats for them, throws a PeerError
  /// naming one not heard from for --distributed-timeout, and looks for their stop requests (Note [A stop while
  /// sitting out]).
  void visit_store(c10d::Store& store);
  void check_alive(c10d::Store& store, std::chrono::steady_clock::time_point now);
  /// A rank that sits out: counts under its alive key, at most once a second (Note [A stop while sitting out]).
  void count_alive();
  void probe(Controller& controller);
  std::vector<std::vector<double>> gather_rows(const std::vector<double>& local, bool posted);

  World& world_;
  PlanSchedule& schedule_;
  std::shared_ptr<DistributedReducer> reducer_;
  std::shared_ptr<CollectiveChannel> channel_;  // every rank's
  std::shared_ptr<Dataset> data_;
  SitOutOptions options_;
  AutoBalancer* balancer_ = nullptr;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  std::vector<int64_t> members_;  // the ranks that take part, in order
  int64_t position_ = 0;          // this rank's index among them (-1: it sits out)
  bool everyone_ = true;          // every rank is at the same point: gathers go over all
  int64_t meetings_ = 0;          // calls so far, the same count on every rank
  int64_t updates_ = 0;           // updates this process took part in
  int64_t share_ = 1;             // this rank's share when it last took part (the probes' size)
  int64_t probes_ = 0;
  std::chrono::steady_clock::time_point next_probe_;
  std::chrono::steady_clock::time_point last_beat_;
  bool stop_posted_ = false;  // this rank, sitting out, told rank 0 it was asked to stop
  bool stop_heard_ = false;   // rank 0 read that a rank that sits out was asked to stop
  std::chrono::steady_clock::time_point last_alive_;  // a rank that sits out: when it last counted
  int64_t alive_count_ = 0;
  /// Rank 0: what a rank that sits out last counted, and when rank 0 saw it change.
  struct Heard {
    std::string count;
    std::chrono::steady_clock::time_point at;
  };
  std::map<int64_t, Heard> alive_;  // [rank that sits out]
  int64_t beats_ = 0;
  std::map<std::vector<int64_t>, std::shared_ptr<CollectiveChannel>> channels_;  // [members]
};

}  // namespace hetseq
