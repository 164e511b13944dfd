#include "hetseq/session/train_session.h"

#include <unistd.h>

#include <algorithm>
#include <numeric>

#include <c10/cuda/CUDACachingAllocator.h>

#include "hetseq/balance/allocation_peak.h"
#include "hetseq/balance/auto_balancer.h"
#include "hetseq/balance/free_memory.h"
#include "hetseq/balance/memory_probe.h"
#include "hetseq/train/precision.h"
#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/checkpoint/training_state.h"
#include "hetseq/checkpoint/shard_files.h"
#include "hetseq/checkpoint/resume_check.h"
#include "hetseq/core/stop_request.h"
#include "hetseq/optim/optimizer_overrides.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/channel/group_channel.h"
#include "hetseq/world/handshake.h"
#include "hetseq/optim.h"
#include "hetseq/task/task_registry.h"
#include "hetseq/train/progress_observer.h"
#include "hetseq/train/sample_id_observer.h"
#include "hetseq/train/step_profile.h"
#include "hetseq/channel/clock_sync.h"
#include "hetseq/shard/optimizer_shards.h"
#include "hetseq/shard/sharding_factory.h"
#include "hetseq/shard/unit_gather.h"
#include "hetseq/observe/json_log_sink.h"
#include "hetseq/balance/rank_summary.h"
#include "hetseq/balance/sit_out_roster.h"
#include "hetseq/observe/tensorboard_sink.h"

namespace hetseq {
namespace {

namespace fs = std::filesystem;

// A batch size rounded down to a multiple of --required-batch-size-multiple (when it is at least one
// multiple), as HetSeq batches.
int64_t round_batch_size(int64_t b, int64_t multiple) { return b >= multiple ? b / multiple * multiple : b; }

// --restore-file: a bare file name lies in --save-dir; anything with a '/' is a path.
fs::path restore_path_of(const CheckpointOptions& ck) {
  if (ck.restore_file.find('/') == std::string::npos) return fs::path(ck.save.save_dir) / ck.restore_file;
  return ck.restore_file;
}

std::string host_name() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string as_text(const std::map<std::string, std::string>& compared) {
  std::string out;
  for (const auto& [k, v] : compared) out += fmt::format("{}{}={}", out.empty() ? "" : " ", k, v);
  return out;
}

}  // namespace

TrainSession::TrainSession(const TrainOptions& options, std::map<std::string, std::string> compared,
                           const FlagValues& task_flags, World& world)
    : TrainSession(options, std::move(compared),
                   [&](const TaskContext& context) {
                     return TaskRegistry::global().get(options.common.task).create(task_flags, context);
                   },
                   world) {}

TrainSession::TrainSession(const TrainOptions& options, std::map<std::string, std::string> compared,
                           const TaskFactory& make_task, World& world)
    : o_(options), world_(world), sharding_(options.distributed.zero_sharding, world.distributed()) {
  if (o_.dataset.max_sentences.size() != 1) {
    throw UsageError(fmt::format("--max-sentences: {} values given for the 1 worker of this process",
                                 o_.dataset.max_sentences.size()));
  }
  if (o_.balance.caps.size() > 1) {
    throw UsageError(fmt::format("--balance-cap: {} values given for the 1 worker of this process",
                                 o_.balance.caps.size()));
  }
  build_model(make_task);
  open_outputs();
  load_data();
  compared["backend (from --cpu and --distributed-backend)"] = world_.backend();
  // Tracing ranks align their clocks together at start (Note [Tracing]).
  compared["tracing (from --trace-dir)"] = o_.observe.trace_dir ? "on" : "off";
  compared[fmt::format("size of the training split '{}' (from --data)", o_.dataset.train_subset)] =
      std::to_string(train_data_->size());
  for (const auto& [split, data] : valid_data_) {
    compared[fmt::format("size of the validation split '{}' (from --data)", split)] = std::to_string(data->size());
  }
  join(compared);
  build_controller();
  resume(compared);
  build_loop();
}

void TrainSession::build_model(const TaskFactory& make_task) {
  TaskContext context;
  context.device = world_.device();
  context.seed = o_.common.seed;
  context.static_shapes = o_.common.cuda_graph;
  task_ = make_task(context);
  HETSEQ_ASSERT(task_ != nullptr, "the task factory of '{}' returned no task", o_.common.task);
  const CheckpointOptions& ck = o_.checkpoint;
  if (!ck.save.no_save && world_.rank() == 0) {
    ensure_writable_dir(ck.save.save_dir, "--save-dir");
    if (const int n = remove_stale_temporaries(ck.save.save_dir); n > 0) {
      log::info("[checkpoint] removed {} temporary file(s) that an interrupted save left in {}", n, ck.save.save_dir);
    }
    if (const auto orphans = remove_orphan_shard_sets(ck.save.save_dir); !orphans.empty()) {
      log::info("[checkpoint] removed {} optimizer shard file(s) and manifest(s) of checkpoints that are not in {} "
                "(an interrupted save or prune)",
                orphans.size(), ck.save.save_dir);
    }
  }
  if (o_.mixed_precision.precision == Precision::kFloat16 && world_.device().is_cpu() &&
      avoid_slow_cpu_fp16_kernels()) {
    log::info("[fp16] this CPU has AVX512-FP16, whose oneDNN float16 convolutions are about 20x slower to "
              "differentiate: oneDNN capped at AVX512_CORE_BF16 (set ONEDNN_MAX_CPU_ISA to choose; Note [Float16 "
              "on CPUs with AVX512-FP16])");
  }
  torch::manual_seed(o_.common.seed);
  model_ = task_->build_model();
  model_->to(world_.device());
  for (const auto& p : model_->parameters()) num_params_ += p.numel();
  log::info("[train] task {}, model with {} parameters, device {}, {} intra-op threads", o_.common.task, num_params_,
            world_.device().str(), torch::get_num_threads());
  digest_ = model_digest(*model_);

  // Resume: every rank reads the checkpoint itself (--save-dir is on a filesystem the nodes share) and
  // the ranks check in resume() that they restored the same state.
  restore_path_ = restore_path_of(ck).string();
  if (fs::exists(restore_path_)) {
    resumed_ = load_checkpoint(restore_path_);
    check_checkpoint_fits(*resumed_, o_.common.task, digest_, restore_path_);
    load_model_tensors(*model_, resumed_->model, restore_path_);
    // A sharded checkpoint: its manifest and every shard file are checked now, on every rank, before
    // anything is written; the optimizer reads its range later (Note [Sharded optimizer state in checkpoints]).
    if (resumed_->optimizer_shards && resumed_->optimizer_state && !ck.reset_optimizer) {
      resumed_->optimizer_pieces =
          OptimizerShards::open(restore_path_, *resumed_->optimizer_shards, resumed_->num_updates);
    }
  } else if (ck.restore_file_given) {
    throw InputError(fmt::format("--restore-file {}: no such file ({}); pass an existing checkpoint, or leave the flag "
                                 "out to start afresh when checkpoint_last.pt is missing",
                                 ck.restore_file, restore_path_));
  }
  // Under full the model is whole on this rank only until it is sharded: its digest now, for the start's check.
  if (sharding_.gathers_parameters()) {
    Checkpoint whole;
    whole.model = model_tensors(*model_);
    whole_model_crc_ = detail::training_state_checksum(whole);
  }
}

// The run's outputs (--trace-dir on every rank, --json-log and --tensorboard-logdir on rank 0) are
// opened before the start handshake, as --save-dir is checked: a rank that cannot write them stops
// with its own error while the others are still waiting in the handshake for it, instead of after it,
// where they would wait out --distributed-timeout in a collective.
void TrainSession::open_outputs() {
  const ObserveOptions& f = o_.observe;
  if (f.trace_dir) {
    TraceOptions t;
    t.dir = *f.trace_dir;
    t.first_update = f.trace_first;
    t.last_update = f.trace_last;
    t.ops = f.trace_ops;
    t.rank = world_.rank();
    t.device = world_.device();
    tracer_ = std::make_shared<Tracer>(t);
  }
  if (world_.rank() != 0) return;
  if (f.json_log) sinks_.push_back(std::make_shared<JsonLogSink>(*f.json_log));
  if (f.tensorboard_logdir) {
    auto tb = std::make_shared<TensorBoardSink>(*f.tensorboard_logdir);
    log::info("[tensorboard] writing scalars to {} (view with: tensorboard --logdir {})", tb->path(),
              *f.tensorboard_logdir);
    sinks_.push_back(tb);
  }
}

void TrainSession::load_data() {
  train_data_ = task_->load_dataset(o_.dataset.train_subset);
  if (o_.dataset.disable_validation) return;
  for (const auto& split : o_.dataset.valid_subsets) valid_data_[split] = task_->load_dataset(split);
}

// The start handshake: every rank's data plan, and every compared flag checked (Note [Compared flags]).
void TrainSession::join(const std::map<std::string, std::string>& compared) {
  WorkerInfo mine;
  mine.host = host_name();
  mine.device = world_.device().str();
  mine.task = o_.common.task;
  mine.num_params = num_params_;
  mine.model_digest = digest_;
  mine.compared = compared;
  const int64_t batch_size = round_batch_size(o_.dataset.max_sentences[0], o_.dataset.required_batch_size_multiple);
  mine.batch_size = {batch_size};
  mine.update_freq = o_.optimization.update_freq;
  mine.valid_batch_size = o_.dataset.max_sentences_valid.value_or(batch_size);
  mine.balance_cap = o_.balance.caps.empty() ? probe_cap(batch_size) : o_.balance.caps[0];
  const RankMemoryBudget memory = measure_memory(batch_size);
  mine.memory_budget = memory.budget_bytes;
  mine.memory_budget_is_free_memory = memory.from_free_memory;
  mine.activation_bytes = memory.activation_bytes;
  mine.memory_micro_batch = memory.micro_batch;
  std::vector<int64_t> batch_sizes, valid_batch_sizes;  // [rank]
  std::vector<std::vector<int64_t>> update_freqs;       // [rank][epoch]
  bool any_gpu = false;
  for (const auto& w : world_.join(mine)) {
    any_gpu = any_gpu || w.device != torch::Device(torch::kCPU).str();
    batch_sizes.push_back(w.batch_size.front());
    valid_batch_sizes.push_back(w.valid_batch_size);
    update_freqs.push_back(w.update_freq);
    balance_caps_.push_back(w.balance_cap);
    // More than one micro-batch an update: --update-freq, or a balance cap that splits its share.
    const bool split = w.balance_cap > 0 && (o_.balance.auto_balance || w.balance_cap < w.batch_size.front());
    const bool accumulates = split || std::any_of(w.update_freq.begin(), w.update_freq.end(),
                                                              [](int64_t f) { return f > 1; });
    memory_.push_back(RankMemoryBudget{w.memory_budget, w.memory_budget_is_free_memory, w.activation_bytes,
                                       w.memory_micro_batch, accumulates});
    if (world_.distributed()) {
      log::info("[train] rank {} on {} ({}): batch size {}, update-freq {}{}", w.rank, w.host, w.device,
                w.batch_size.front(), fmt::join(w.update_freq, ","),
                w.balance_cap > 0 ? fmt::format(", balance cap {}", w.balance_cap) : "");
    }
  }
  schedule_ = std::make_unique<PlanSchedule>(batch_sizes, update_freqs, valid_batch_sizes, world_.rank());
  if (!world_.distributed()) {
    reducer_ = std::make_shared<LocalReducer>();
    channel_ = std::make_shared<LocalChannel>();
    return;
  }
  // The gradients go through the reducer, every other message through the channel (Note [Communication
  // roles]); both over the world's process group.
  // Where a rank is on a GPU the host's part of the statistics travels on a host group, on every rank alike
  // (Note [Stat sync]).
  stats_on_host_group_ = any_gpu;
  channel_ = std::make_shared<GroupChannel>(world_.group(), world_.device(), o_.distributed.fast_stat_sync,
                                            any_gpu ? world_.host_group() : nullptr);
  DdpOptions ddp = o_.distributed.ddp;
  ddp.powersgd.seed = o_.common.seed;
  ddp.shared_memory_timeout = o_.distributed.world.timeout;
  // A resumed run reduces in the layout the saved run had (Note [Bucketed reduction]).
  if (resumed_) ddp.initial_buckets = resumed_->bucket_layout;
  if (sharding_.sums_gradients_to_owners()) {
    sharding_.check_parameters(model_->parameters(), o_.common.task);
    return;  // the sharding strategy builds its own reducer (Note [Sharded gradients])
  }
  reducer_ = std::make_shared<DistributedReducer>(*model_, world_.group(), ddp);
}

// --zero-sharding full: which unit holds each parameter, and the units' own process group (Note [Sharded
// parameters]).
void TrainSession::add_units(ShardingOptions& sharding) const {
  if (!sharding_.gathers_parameters()) return;
  sharding.unit_of = parameter_units(*model_);
  sharding.unit_group = world_.role_group("unit-gather");
  if (stats_on_host_group_) sharding.host_group = world_.host_group();
  auto* shardable = dynamic_cast<ShardableModel*>(model_.get());
  if (shardable) {
    sharding.set_unit_runner = [shardable](std::shared_ptr<UnitRunner> runner) {
      shardable->set_unit_runner(std::move(runner));
    };
  }
  const UnitSizes sizes = unit_sizes(model_->parameters(), sharding.unit_of);
  log::info("[zero] full: {} unit(s) of task {}'s model gathered around their passes (the largest {} parameters); "
            "{} parameters in no unit stay whole on every rank{}",
            sizes.units, o_.common.task, sizes.largest, sizes.root,
            shardable ? "" : " (the model names no units: it is not a ShardableModel)");
}

void TrainSession::build_controller() {
  check_memory();
  // --zero-sharding (Note [Sharded optimizer state]): the budget is this rank's --memory-budget or free
  // memory, as the memory check read it.
  ShardingOptions sharding;
  sharding.mode = sharding_.mode();
  sharding.budget_bytes = memory_[static_cast<size_t>(world_.rank())].budget_bytes;
  sharding.json = o_.common.log_format == LogFormat::kJson;
  sharding.bucket_bytes = static_cast<int64_t>(o_.distributed.ddp.bucket_cap_mb * (1 << 20));
  sharding.buffers = o_.distributed.ddp.broadcast_buffers ? model_->buffers() : std::vector<torch::Tensor>{};
  add_units(sharding);
  std::unique_ptr<ShardingStrategy> strategy =
      make_sharding_strategy(model_->parameters(), o_.optimization.make_optimizer, reducer_,
                             world_.distributed() ? world_.group() : nullptr, sharding);
  auto scheduler = o_.optimization.make_lr_scheduler(strategy->optimizer());
  ControllerOptions copts;
  copts.clip_norm = o_.optimization.clip_norm;
  copts.seed = o_.common.seed;
  copts.rank = world_.rank();
  copts.device = world_.device();
  copts.cuda_graph = o_.common.cuda_graph;
  if (copts.cuda_graph && strategy->needs_stand_ins()) {
    log::info("[cuda-graph] --zero-sharding full gathers parameters between the kernels of a pass: training "
              "uncaptured");
    copts.cuda_graph = false;
  }
  const MixedPrecisionOptions& mp = o_.mixed_precision;
  copts.precision = mp.precision;
  if (mp.precision == Precision::kFloat16) {
    LossScalerOptions scaler = mp.scaler;
    scaler.scale_window = mp.scale_window.value_or(
        MixedPrecisionOptions::default_scale_window(schedule_->micro_batches_per_update(1)));
    copts.loss_scaling = scaler;
    log::info("[fp16] float16 forward passes (autocast on {}); loss scale {}, doubled after {} updates without "
              "overflow, halved on overflow{}",
              world_.device().str(), scaler.init_scale, scaler.scale_window,
              scaler.threshold ? fmt::format(" (not below {})", *scaler.threshold) : "");
  } else if (mp.precision == Precision::kBFloat16) {
    log::info("[bf16] bfloat16 forward passes (autocast on {})", world_.device().str());
  }
  controller_ = std::make_unique<Controller>(*task_, model_, std::move(strategy), std::move(scheduler), copts,
                                             channel_);
  controller_->set_stand_in_data(train_data_);
}

void TrainSession::resume(const std::map<std::string, std::string>& compared) {
  const CheckpointOptions& ck = o_.checkpoint;
  CheckpointerOptions copts;
  copts.save = ck.save;
  copts.rank = world_.rank();
  copts.world_size = world_.world_size();
  copts.task = o_.common.task;
  copts.model_digest = digest_;
  copts.options = as_text(compared);
  if (world_.distributed()) {
    copts.fence = std::make_shared<SaveFence>(world_.store(), world_.rank(), world_.world_size(), world_.timeout(),
                                              world_.checkpoint_timeout());
  }
  checkpointer_ = std::make_unique<Checkpointer>(copts, resumed_ ? resumed_->best : std::nullopt);
  if (!resumed_) {
    if (!ck.optimizer_overrides.empty()) apply_optimizer_overrides(controller_->optimizer(), ck.optimizer_overrides);
  } else {
    ResumeOptions resume;
    resume.reset_lr_scheduler = ck.reset_lr_scheduler;
    resume.reset_meters = ck.reset_meters;
    resume.reset_optimizer = ck.reset_optimizer;
    resume.optimizer_overrides = ck.optimizer_overrides;
    controller_->load_state(*resumed_, resume, restore_path_);
    start_ = ck.reset_dataloader ? IteratorPosition{1, 0} : IteratorPosition{resumed_->epoch, resumed_->offset};
    log::info("[checkpoint] resumed from {}: {} updates done, continuing in epoch {} at sample {} of its order",
              restore_path_, controller_->num_updates(), start_.epoch, start_.offset);
    restore_split();
    const DataPlan now = schedule_->train_plan(start_.epoch);
    if (!(resumed_->data_plan == SavedDataPlan{now.batch_sizes, now.update_freqs, now.shares})) {
      log::info("[checkpoint] the data plan changed: saved with batch sizes [{}] and update-freqs [{}] on {} rank(s), "
                "now [{}] and [{}] on {}; the epoch continues from the same sample, none repeated or skipped",
                fmt::join(resumed_->data_plan.batch_sizes, ","), fmt::join(resumed_->data_plan.update_freqs, ","),
                resumed_->data_plan.batch_sizes.size(), fmt::join(now.batch_sizes, ","),
                fmt::join(now.update_freqs, ","), now.batch_sizes.size());
    }
  }
  if (!world_.distributed()) return;
  controller_->sharding().collect_model_digests();  // under full, each parameter's CRC, not a whole copy
  check_ranks_agree(*world_.store(), world_.rank(), world_.world_size(), "resume",
                    state_digest(checkpointer_->snapshot(*controller_, start_, schedule_->train_plan(start_.epoch))) +
                        (whole_model_crc_ ? fmt::format(", model as restored {:08x}", *whole_model_crc_) : ""),
                    "the training state at start (model, optimizer, schedule, position)",
                    "every rank must resume from the same checkpoint: put --save-dir on a filesystem all nodes "
                    "share, or give every node the same --restore-file",
                    world_.timeout());
}

// A balanced run resumes with the split that was in force when it stopped (so that it continues as
// the run never stopped would), when the world and the samples per update are the same; otherwise
// (another cluster) the balancer starts from the given batch sizes. See Note [Balancing].
void TrainSession::restore_split() {
  const SavedDataPlan& saved = resumed_->data_plan;
  if (!o_.balance.auto_balance || saved.shares.empty() || o_.checkpoint.reset_dataloader) return;
  const DataPlan now = schedule_->train_plan(start_.epoch);
  const int64_t saved_total = std::accumulate(saved.shares.begin(), saved.shares.end(), int64_t{0});
  if (static_cast<int64_t>(saved.shares.size()) != now.world_size() || saved_total != now.samples_per_update()) {
    log::info("[balance] the checkpoint's split [{}] was for another world or total; starting from the given batch "
              "sizes", fmt::join(saved.shares, ","));
    return;
  }
  const std::string why_not = sit_out_refused();
  if (std::count(saved.shares.begin(), saved.shares.end(), 0) > 0 && !why_not.empty()) {
    log::info("[balance] the checkpoint's split [{}] sits ranks out, which this run cannot ({}); starting from the "
              "given batch sizes", fmt::join(saved.shares, ","), why_not);
    return;
  }
  std::vector<int64_t> micro_batches;
  for (size_t r = 0; r < saved.shares.size(); ++r) {
    micro_batches.push_back(micro_batches_for(saved.shares[r], balance_caps_[r]));
  }
  schedule_->set_shares(start_.epoch, saved.shares, micro_batches);
  log::info("[balance] continuing with the checkpoint's split [{}]", fmt::join(saved.shares, ","));
}

void TrainSession::build_loop() {
  const CheckpointOptions& ck = o_.checkpoint;
  ValidatorOptions vopts;
  vopts.device = world_.device();
  vopts.precision = o_.mixed_precision.precision;
  vopts.num_workers = o_.dataset.num_workers;
  vopts.stand_ins = controller_->sharding().needs_stand_ins();
  validator_ = std::make_unique<Validator>(*task_, channel_, schedule_->valid_plan(), vopts);
  TrainingLoopParts parts{controller_.get(), schedule_.get(), train_data_, valid_data_, validator_.get(),
                          checkpointer_.get(), /*tracer=*/nullptr};  // set below with --trace-dir
  TrainingLoopOptions lopts;
  lopts.max_epoch = o_.optimization.max_epoch;
  lopts.max_update = o_.optimization.max_update;
  lopts.min_lr = o_.optimization.min_lr;
  lopts.valid_subsets = o_.dataset.valid_subsets;
  lopts.validate_interval = o_.dataset.validate_interval;
  lopts.disable_validation = o_.dataset.disable_validation;
  lopts.best_checkpoint_metric = ck.save.best_checkpoint_metric;
  lopts.stop_requested = [] { return stop_request::requested(); };
  lopts.order.seed = o_.common.seed;
  lopts.order.curriculum = o_.dataset.curriculum;
  lopts.num_workers = o_.dataset.num_workers;
  lopts.device = world_.device();
  lopts.continue_epoch_meters = !ck.reset_meters;
  if (tracer_) {
    tracer_->set_label(fmt::format("rank {} ({}, {}, {} samples per update)", world_.rank(), host_name(),
                                   world_.device().str(), schedule_->train_plan(start_.epoch).share(world_.rank())));
    if (world_.distributed()) tracer_->set_clock(align_clocks(*world_.group(), world_.device()));
    parts.tracer = tracer_;
  }
  loop_ = std::make_unique<TrainingLoop>(parts, lopts);
  add_observers();
}

}  // namespace hetseq
