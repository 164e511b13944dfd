#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "hetseq/balance/auto_balancer.h"
#include "hetseq/shard/memory_fit.h"
#include "hetseq/shard/sharding_factory.h"
#include "hetseq/shard/sharding_policy.h"
#include "hetseq/balance/sit_out_roster.h"
#include "hetseq/checkpoint/checkpoint.h"
#include "hetseq/train/checkpointer.h"
#include "hetseq/data/plan_schedule.h"
#include "hetseq/core/flag_set.h"
#include "hetseq/world/world.h"
#include "hetseq/session/session_options.h"
#include "hetseq/session/train.h"
#include "hetseq/task/task.h"
#include "hetseq/observe/tracer.h"
#include "hetseq/train/controller.h"
#include "hetseq/observe/progress.h"
#include "hetseq/train/training_loop.h"
#include "hetseq/train/validator.h"

namespace hetseq {

/// One rank's training, built from option structs (what hetseq-train reads from its command line, or
/// what a program of its own fills in): the task, model and data, the world's data plans (after the
/// start handshake), the Controller (optimizer, schedule, reducer, precision), the resumed state, the
/// Validator, the Checkpointer and the loop with its observers. See docs/DESIGN.md, "The path of one
/// update".
class TrainSession {
 public:
  /// Builds everything and joins `world` (which stays the caller's). `task_flags` are the values the task
  /// is built from (TaskSpec::create); `compared` is what every rank must agree on, by name (every flag
  /// that is not per-rank, as hetseq-train compares them; the session adds what it resolves itself).
  /// Throws hetseq::UsageError or hetseq::InputError naming the flag, file or rank.
  TrainSession(const TrainOptions& options, std::map<std::string, std::string> compared,
               const FlagValues& task_flags, World& world);
  /// As above, with the task that `make_task` builds (hetseq::train with a task of its own) instead of
  /// the registered task `options.common.task`, which still names it in logs and checkpoints.
  TrainSession(const TrainOptions& options, std::map<std::string, std::string> compared, const TaskFactory& make_task,
               World& world);
  /// Trains until a limit; returns the last epoch trained.
  int64_t run() { return loop_->run(start_); }
  /// Whether run() ended on a stop signal (see Note [Clean stops]).
  bool stopped() const { return loop_->stopped(); }
  /// Updates done, with those of a resumed checkpoint.
  int64_t num_updates() const { return controller_->num_updates(); }
  /// Adds a watcher of the loop (after the session's own), before run().
  void add_observer(std::shared_ptr<TrainingObserver> observer) { loop_->add_observer(std::move(observer)); }

 private:
  void build_model(const TaskFactory& make_task);
  void open_outputs();
  void load_data();
  void join(const std::map<std::string, std::string>& compared);
  void build_controller();
  void add_units(ShardingOptions& sharding) const;
  void resume(const std::map<std::string, std::string>& compared);
  int64_t probe_cap(int64_t batch_size);
  RankMemoryBudget measure_memory(int64_t batch_size);
  void check_memory();
  void restore_split();
  /// Why no rank may sit out in this run, or "" (Note [Sharing an update]).
  std::string sit_out_refused() const;
  void build_loop();
  void add_balancer();
  void add_observers();
  /// Every rank's figures through the channel: the balancer's and the rank summaries' gathers.
  GatherFn gather_figures() const;

  const TrainOptions& o_;
  World& world_;
  const ShardingPolicy sharding_;  // --zero-sharding in this world: what the session asks of it
  std::unique_ptr<Task> task_;
  std::shared_ptr<torch::nn::Module> model_;
  int64_t num_params_ = 0;
  std::string digest_;
  /// Under --zero-sharding full: the CRC of the whole model as this rank built or restored it, taken before the
  /// model is sharded (Note [Sharded parameters], "The resume check"); compared across the ranks at start.
  std::optional<int64_t> whole_model_crc_;
  std::shared_ptr<Dataset> train_data_;
  std::map<std::string, std::shared_ptr<Dataset>> valid_data_;  // [split]
  std::optional<Checkpoint> resumed_;
  std::string restore_path_;
  std::unique_ptr<PlanSchedule> schedule_;
  std::vector<int64_t> balance_caps_;  // [rank] --balance-cap (0: none)
  std::vector<RankMemoryBudget> memory_;  // [rank] budgets and activations for the memory check
  std::shared_ptr<GradientReducer> reducer_;   // the gradients
  std::shared_ptr<CollectiveChannel> channel_;  // every other message (Note [Communication roles])
  bool stats_on_host_group_ = false;  // some rank is on a GPU: the channels' host rows on a host group (Note [Stat sync])
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Validator> validator_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<ProgressLogger> progress_;
  std::shared_ptr<Tracer> tracer_;             // --trace-dir
  std::vector<std::shared_ptr<LogSink>> sinks_;  // rank 0: --json-log, --tensorboard-logdir
  std::shared_ptr<AutoBalancer> balancer_;     // every distributed run
  std::shared_ptr<SitOutRoster> roster_;       // --auto-balance where ranks may sit out (Note [Sharing an update])
  std::unique_ptr<TrainingLoop> loop_;
  IteratorPosition start_{1, 0};
};

}  // namespace hetseq
