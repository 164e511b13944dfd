#include "hetseq/cli/train_command.h"

#include <unistd.h>

#include <iostream>
#include <thread>

#include "hetseq/core/logging.h"
#include <torch/torch.h>

#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/checkpoint/checkpoint.h"
#include "hetseq/checkpoint/checkpoint_manager.h"
#include "hetseq/checkpoint/optimizer_overrides.h"
#include "hetseq/checkpoint/training_state.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/core/error.h"
#include "hetseq/core/parse.h"
#include "hetseq/data/batch_loader.h"
#include "hetseq/data/sample_id_log.h"
#include "hetseq/distributed/ddp_reducer.h"
#include "hetseq/distributed/handshake.h"
#include "hetseq/distributed/launcher.h"
#include "hetseq/distributed/process_group.h"
#include "hetseq/distributed/rendezvous.h"
#include "hetseq/optim.h"
#include "hetseq/task/task_registry.h"
#include "hetseq/train/controller.h"

namespace hetseq::cli {
namespace {

namespace fs = std::filesystem;

// A batch size rounded down to a multiple of --required-batch-size-multiple (when it is at least one
// multiple), as HetSeq batches.
int64_t round_batch_size(int64_t b, int64_t multiple) { return b >= multiple ? b / multiple * multiple : b; }

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimizationOptions& o, std::vector<torch::Tensor> params) {
  if (o.optimizer == "adam") return std::make_unique<optim::Adam>(std::move(params), o.adam);
  if (o.optimizer == "adadelta") return std::make_unique<optim::Adadelta>(std::move(params), o.adadelta);
  return std::make_unique<optim::Sgd>(std::move(params), o.sgd);
}

std::unique_ptr<optim::LrScheduler> make_lr_scheduler(const OptimizationOptions& o, optim::Optimizer& optimizer) {
  if (o.lr_scheduler == "PolynomialDecayScheduler") {
    optim::PolynomialDecayOptions p;
    p.lrs = o.lr;
    p.warmup_updates = o.warmup_updates;
    p.force_anneal = o.force_anneal;
    p.end_learning_rate = o.end_learning_rate;
    p.power = o.power;
    p.total_num_update = o.total_num_update;
    return std::make_unique<optim::PolynomialDecay>(optimizer, p);
  }
  if (o.lr_scheduler == "fixed") {
    optim::FixedOptions f;
    f.lrs = o.lr;
    f.force_anneal = o.force_anneal;
    f.lr_shrink = o.lr_shrink;
    f.warmup_updates = o.warmup_updates;
    return std::make_unique<optim::Fixed>(optimizer, f);
  }
  optim::InverseSqrtOptions s;
  s.lrs = o.lr;
  s.warmup_updates = o.warmup_updates;
  s.warmup_init_lr = o.warmup_init_lr;
  return std::make_unique<optim::InverseSqrt>(optimizer, s);
}

torch::Device pick_device(bool cpu, int64_t device_id = 0) {
  if (!cpu && torch::cuda::is_available()) return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_id));
  return torch::kCPU;
}

// Runs one validation pass over `dataset`, the split cut across ranks by `plan`, and returns the
// sums over all ranks.
LogSums validate(Controller& controller, std::shared_ptr<Dataset> dataset, const DataPlan& plan, int64_t num_workers) {
  EpochIteratorOptions order;
  order.shuffle = false;
  UpdateStream stream(EpochBatchIterator(dataset->size(), plan, order),
                      std::make_shared<BatchLoader>(dataset, num_workers));
  stream.begin_epoch(1);
  LogSums local;
  while (!stream.end_of_epoch()) {
    for (const Batch& batch : stream.next()) {
      for (const auto& [k, v] : controller.valid_step(batch)) local[k] += v;
    }
  }
  return controller.reduce_sums(local);
}

// --restore-file: a bare file name lies in --save-dir; anything with a '/' is a path.
fs::path restore_path_of(const CheckpointOptions& ck) {
  if (ck.restore_file.find('/') == std::string::npos) return fs::path(ck.save.save_dir) / ck.restore_file;
  return ck.restore_file;
}

SavedDataPlan saved_plan(const DataPlan& plan) { return SavedDataPlan{plan.batch_sizes, plan.update_freqs}; }

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

std::string host_name() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// This node's workers: --distributed-gpus, else the visible CUDA devices, else 1.
int64_t local_workers(const TrainOptions& o) {
  if (o.distributed.gpus) return *o.distributed.gpus;
  if (!o.common.cpu && torch::cuda::is_available()) return static_cast<int64_t>(torch::cuda::device_count());
  return 1;
}

// Starts this node's workers (see hetseq/distributed/launcher.h).
int launch(const TrainOptions& o, int argc, const char* const argv[], int64_t workers) {
  const auto& d = o.distributed;
  LaunchOptions launch;
  launch.argv.assign(argv, argv + argc);
  launch.num_workers = workers;
  launch.first_rank = d.rank;
  if (o.dataset.max_sentences.size() == 1) {
    launch.batch_sizes.assign(static_cast<size_t>(workers), o.dataset.max_sentences[0]);
  } else if (static_cast<int64_t>(o.dataset.max_sentences.size()) == workers) {
    launch.batch_sizes = o.dataset.max_sentences;
  } else {
    throw UsageError(fmt::format("--max-sentences: {} values for the {} workers of this node (--distributed-gpus); "
                                 "give one value, or one per worker",
                                 o.dataset.max_sentences.size(), workers));
  }
  const bool on_cpu = o.common.cpu || !torch::cuda::is_available();
  launch.intra_op_threads = o.common.intra_op_threads > 0
                                ? o.common.intra_op_threads
                                : (on_cpu ? std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) / workers) : 0);
  if (d.init_method.rfind("tcp://", 0) == 0 && d.rank == 0) {
    const InitMethod m = parse_init_method(d.init_method, {});
    launch.host_tcp_store = true;
    launch.store_host = m.host;
    launch.store_port = m.port;
  } else if (d.init_method.empty()) {
    throw UsageError("--distributed-init-method is needed to start several workers: tcp://HOST:PORT, "
                     "file:///shared/path or env://");
  }
  launch.store_timeout = std::chrono::seconds(d.timeout_s);
  return launch_workers(launch);
}

int train(int argc, const char* const argv[]) {
  cxxopts::Options parser = make_train_parser(find_task_flag(argc, argv));
  cxxopts::ParseResult args = parse_command_line(parser, argc, argv);
  if (args.count("help")) {
    std::vector<std::string> groups{"", "Dataset and data loading", "Distributed training", "Optimization",
                                    "Optimizer", "Learning rate scheduler", "Checkpointing"};
    for (const auto& g : parser.groups()) {
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    }
    std::cout << parser.help(groups) << std::endl;
    return 0;
  }
  const TrainOptions o = read_train_options(args);
  const auto& d = o.distributed;
  const TaskSpec& spec = TaskRegistry::global().get(o.common.task);

  // A node with several workers starts them and waits (HetSeq's spawn); a worker runs below.
  const int64_t workers = d.no_spawn ? 1 : local_workers(o);
  if (workers > 1) return launch(o, argc, argv, workers);

  RendezvousOptions rdv;
  rdv.init_method = d.init_method;
  rdv.world_size = d.world_size;
  rdv.rank = d.rank;
  rdv.timeout = std::chrono::seconds(d.timeout_s);
  const auto environment = process_environment();
  std::optional<int64_t> env_local_rank;
  bool distributed = d.world_size.value_or(1) > 1;
  if (!distributed && d.init_method == "env://") distributed = environment.count("WORLD_SIZE") != 0;
  if (!distributed && d.init_method.empty()) distributed = environment.count("SLURM_NTASKS") != 0 && environment.at("SLURM_NTASKS") != "1";
  if (distributed) {
    const InitMethod method = parse_init_method(d.init_method, environment);
    const bool ranks_from_environment = method.kind == InitMethod::Kind::kEnv || method.kind == InitMethod::Kind::kSlurm;
    if (ranks_from_environment && !d.rank_given) rdv.rank.reset();  // RANK / SLURM_PROCID say
    resolve_ranks(method, environment, rdv, env_local_rank);
    rdv.store_hosted_elsewhere = environment.count(kStoreHostedEnv) != 0;
  } else {
    rdv.world_size = 1;
    rdv.rank = 0;
  }
  const int64_t rank = *rdv.rank;
  const int64_t world_size = *rdv.world_size;
  log::set_rank(rank);
  log::enable_all_ranks(d.log_all_ranks);
  if (o.dataset.max_sentences.size() != 1) {
    throw UsageError(fmt::format("--max-sentences: {} values given for the 1 worker of this process",
                                 o.dataset.max_sentences.size()));
  }
  if (o.common.intra_op_threads > 0) torch::set_num_threads(static_cast<int>(o.common.intra_op_threads));

  TaskContext context;
  const int64_t device_id = env_local_rank.value_or(d.device_id);
  context.device = pick_device(o.common.cpu, device_id);
  context.seed = o.common.seed;
  std::unique_ptr<Task> task = spec.create(args, context);
  const CheckpointOptions& ck = o.checkpoint;
  if (!ck.save.no_save && rank == 0) {
    ensure_writable_dir(ck.save.save_dir, "--save-dir");
    if (const int n = remove_stale_temporaries(ck.save.save_dir); n > 0) {
      log::info("[checkpoint] removed {} temporary file(s) that an interrupted save left in {}", n, ck.save.save_dir);
    }
  }

  torch::manual_seed(o.common.seed);
  std::shared_ptr<torch::nn::Module> model = task->build_model();
  model->to(context.device);
  int64_t num_params = 0;
  for (const auto& p : model->parameters()) num_params += p.numel();
  log::info("[train] task {}, model with {} parameters, device {}, {} intra-op threads", o.common.task, num_params,
            context.device.str(), torch::get_num_threads());
  const std::string digest = model_digest(*model);

  // Resume: every rank reads the checkpoint itself (--save-dir is on a filesystem the nodes share) and
  // the ranks check below that they restored the same state.
  const fs::path restore_path = restore_path_of(ck);
  std::optional<Checkpoint> resumed;
  if (fs::exists(restore_path)) {
    resumed = load_checkpoint(restore_path);
    check_checkpoint_fits(*resumed, o.common.task, digest, restore_path.string());
    load_model_tensors(*model, resumed->model, restore_path.string());
  } else if (ck.restore_file_given) {
    throw InputError(fmt::format("--restore-file {}: no such file ({}); pass an existing checkpoint, or leave the flag "
                                 "out to start afresh when checkpoint_last.pt is missing",
                                 ck.restore_file, restore_path.string()));
  }

  auto train_data = task->load_dataset(o.dataset.train_subset);
  std::map<std::string, std::shared_ptr<Dataset>> valid_data;
  if (!o.dataset.disable_validation) {
    for (const auto& split : o.dataset.valid_subsets) valid_data[split] = task->load_dataset(split);
  }
  const int64_t batch_size = round_batch_size(o.dataset.max_sentences[0], o.dataset.required_batch_size_multiple);
  const int64_t valid_batch_size = o.dataset.max_sentences_valid.value_or(batch_size);

  // The data plans of all ranks: exchanged in the start handshake. See Note [Data plan].
  std::vector<std::vector<int64_t>> update_freqs{o.optimization.update_freq};  // [rank][epoch]
  std::vector<int64_t> batch_sizes{batch_size}, valid_batch_sizes{valid_batch_size};  // [rank]
  std::shared_ptr<GradientReducer> reducer = std::make_shared<LocalReducer>();
  std::shared_ptr<DistributedReducer> ddp;
  std::optional<Rendezvous> joined;
  if (distributed) {
    joined = rendezvous(rdv);
    WorkerInfo mine;
    mine.rank = rank;
    mine.world_size = world_size;
    mine.host = host_name();
    mine.device = context.device.str();
    mine.task = o.common.task;
    mine.num_params = num_params;
    mine.model_digest = digest;
    mine.options_digest = o.must_match();
    mine.batch_size = {batch_size};
    mine.update_freq = o.optimization.update_freq;
    mine.valid_batch_size = valid_batch_size;
    const auto infos = exchange_worker_info(*joined->store, mine, rdv.timeout);
    ProcessGroupOptions pg;
    pg.backend = !d.backend.empty() ? d.backend : (context.device.is_cuda() ? "nccl" : "gloo");
    pg.timeout = std::chrono::seconds(d.timeout_s);
    pg.device_index = static_cast<int>(device_id);
    if (const InitMethod m = parse_init_method(d.init_method, environment); m.kind != InitMethod::Kind::kFile) {
      pg.master_host = m.host;
    }
    auto group = make_process_group(joined->store, rank, world_size, pg);
    batch_sizes.clear();
    valid_batch_sizes.clear();
    update_freqs.clear();
    for (const auto& w : infos) {
      batch_sizes.push_back(w.batch_size.front());
      valid_batch_sizes.push_back(w.valid_batch_size);
      update_freqs.push_back(w.update_freq);
      log::info("[train] rank {} on {} ({}): batch size {}, update-freq {}", w.rank, w.host, w.device,
                w.batch_size.front(), fmt::join(w.update_freq, ","));
    }
    DdpOptions ddp_options;
    ddp_options.bucket_cap_mb = d.bucket_cap_mb;
    ddp_options.find_unused_parameters = d.find_unused_parameters;
    ddp_options.fast_stat_sync = d.fast_stat_sync;
    ddp = std::make_shared<DistributedReducer>(*model, group, ddp_options);
    reducer = ddp;
  }
  auto plan_for_epoch = [&](int64_t epoch) {
    DataPlan plan;
    plan.batch_sizes = batch_sizes;
    for (const auto& uf : update_freqs) plan.update_freqs.push_back(for_epoch(uf, epoch));
    plan.rank = rank;
    plan.validate();
    return plan;
  };
  DataPlan valid_plan;
  valid_plan.batch_sizes = valid_batch_sizes;
  valid_plan.update_freqs.assign(valid_batch_sizes.size(), 1);
  valid_plan.rank = rank;

  auto optimizer = make_optimizer(o.optimization, model->parameters());
  auto scheduler = make_lr_scheduler(o.optimization, *optimizer);
  ControllerOptions copts;
  copts.clip_norm = o.optimization.clip_norm;
  copts.seed = o.common.seed;
  copts.rank = rank;
  copts.device = context.device;
  const MixedPrecisionOptions& mp = o.mixed_precision;
  copts.precision = mp.precision;
  if (mp.precision == Precision::kFloat16) {
    LossScalerOptions scaler = mp.scaler;
    int64_t micro_batches = 0;  // per update, over all ranks
    for (int64_t u : plan_for_epoch(1).update_freqs) micro_batches += u;
    scaler.scale_window = mp.scale_window.value_or(MixedPrecisionOptions::default_scale_window(micro_batches));
    copts.loss_scaling = scaler;
    log::info("[fp16] float16 forward passes (autocast on {}); loss scale {}, doubled after {} updates without "
              "overflow, halved on overflow{}",
              context.device.str(), scaler.init_scale, scaler.scale_window,
              scaler.threshold ? fmt::format(" (not below {})", *scaler.threshold) : "");
  } else if (mp.precision == Precision::kBFloat16) {
    log::info("[bf16] bfloat16 forward passes (autocast on {})", context.device.str());
  }
  Controller controller(*task, model, std::move(optimizer), std::move(scheduler), reducer, copts);

  IteratorPosition start{1, 0};
  CheckpointManager manager(ck.save);
  if (resumed) {
    ResumeOptions resume;
    resume.reset_dataloader = ck.reset_dataloader;
    resume.reset_lr_scheduler = ck.reset_lr_scheduler;
    resume.reset_meters = ck.reset_meters;
    resume.reset_optimizer = ck.reset_optimizer;
    resume.optimizer_overrides = ck.optimizer_overrides;
    start = restore_checkpoint(controller, *resumed, resume, restore_path.string());
    manager.set_best(resumed->best);
    log::info("[checkpoint] resumed from {}: {} updates done, continuing in epoch {} at sample {} of its order",
              restore_path.string(), controller.num_updates(), start.epoch, start.offset);
    const SavedDataPlan now = saved_plan(plan_for_epoch(start.epoch));
    if (!(resumed->data_plan == now)) {
      log::info("[checkpoint] the data plan changed: saved with batch sizes [{}] and update-freqs [{}] on {} rank(s), "
                "now [{}] and [{}] on {}; the epoch continues from the same sample, none repeated or skipped",
                fmt::join(resumed->data_plan.batch_sizes, ","), fmt::join(resumed->data_plan.update_freqs, ","),
                resumed->data_plan.batch_sizes.size(), fmt::join(now.batch_sizes, ","),
                fmt::join(now.update_freqs, ","), now.batch_sizes.size());
    }
  } else if (!ck.optimizer_overrides.empty()) {
    apply_optimizer_overrides(controller.optimizer(), ck.optimizer_overrides);
  }
  CaptureContext capture;
  capture.task = o.common.task;
  capture.model_digest = digest;
  capture.options = o.must_match();
  capture.with_optimizer_state = !ck.save.no_save_optimizer_state;
  if (joined) {
    capture.next = start;
    check_ranks_agree(*joined->store, rank, world_size, "resume", state_digest(capture_checkpoint(controller, capture)),
                      "the training state at start (model, optimizer, schedule, position)",
                      "every rank must resume from the same checkpoint: put --save-dir on a filesystem all nodes "
                      "share, or give every node the same --restore-file",
                      std::chrono::seconds(d.timeout_s));
  }

  EpochIteratorOptions order;
  order.seed = o.common.seed;
  order.curriculum = o.dataset.curriculum;
  UpdateStream stream(EpochBatchIterator(train_data->size(), plan_for_epoch(start.epoch), order),
                      std::make_shared<BatchLoader>(train_data, o.dataset.num_workers));
  stream.restore(start);
  log::info("[train] {} training samples, {} samples per update over {} rank(s), {} updates per epoch",
            train_data->size(), stream.iterator().plan().samples_per_update(), world_size,
            stream.iterator().updates_per_epoch());

  ProgressLogger progress(rank == 0 ? o.common.log_format : LogFormat::kNone,
                          rank == 0 && !o.common.no_progress_bar && ::isatty(fileno(stdout)), o.common.log_interval);
  std::unique_ptr<SampleIdLog> sample_ids;
  if (ck.dump_sample_ids) sample_ids = std::make_unique<SampleIdLog>(*ck.dump_sample_ids, rank);

  // Validation on every --valid-subset: logs, and returns the loss (for the LR schedule) and the
  // --best-checkpoint-metric of the first subset.
  struct Validation {
    std::optional<double> loss, metric;
  };
  auto run_validation = [&](int64_t epoch) {
    Validation v;
    for (const auto& split : o.dataset.valid_subsets) {
      const auto stats = controller.valid_stats(validate(controller, valid_data.at(split), valid_plan,
                                                         o.dataset.num_workers));
      progress.log(epoch, "valid", stats, split);
      if (v.loss) continue;
      v.loss = stats.front().value;
      v.metric = find_stat(stats, ck.save.best_checkpoint_metric);
    }
    return v;
  };
  int64_t last_saved = -1;  // num_updates of the last save
  auto save = [&](int64_t epoch, bool end_of_epoch, IteratorPosition next, std::optional<double> metric) {
    last_saved = controller.num_updates();
    if (rank != 0) return;
    const SavePoint point{epoch, controller.num_updates(), end_of_epoch, metric};
    const auto files = manager.files_for(point);
    manager.record(point);
    if (files.empty()) return;
    capture.next = next;
    capture.data_plan = saved_plan(plan_for_epoch(epoch));
    capture.best = manager.best();
    const auto removed = manager.write(capture_checkpoint(controller, capture), files);
    std::vector<std::string> names;
    for (const auto& f : files) names.push_back(f.filename().string());
    log::info("[checkpoint] saved {} in {} (epoch {}, {} updates{})", fmt::join(names, ", "), ck.save.save_dir, epoch,
              controller.num_updates(),
              manager.best() ? fmt::format(", best {} {}", ck.save.best_checkpoint_metric, *manager.best()) : "");
    for (const auto& f : removed) log::info("[checkpoint] removed {} (retention flags)", f.string());
  };

  const int64_t max_epoch = o.optimization.max_epoch > 0 ? o.optimization.max_epoch : INT64_MAX;
  const int64_t max_update = o.optimization.max_update > 0 ? o.optimization.max_update : INT64_MAX;
  const bool validation_on = !o.dataset.disable_validation;
  double lr = controller.lr();
  int64_t epoch = start.epoch;
  bool first_epoch = true;
  while (lr > o.optimization.min_lr && epoch <= max_epoch && controller.num_updates() < max_update) {
    stream.set_plan(plan_for_epoch(epoch));
    stream.begin_epoch(epoch);
    // A run resumed inside an epoch continues that epoch's meters.
    if (!(first_epoch && start.offset > 0 && !ck.reset_meters)) controller.reset_epoch_meters();
    first_epoch = false;
    const int64_t total = stream.updates_left();
    int64_t i = 0;
    double step_s = 0, wait_s = 0;  // over the current log interval, for --log-all-ranks
    while (!stream.end_of_epoch() && controller.num_updates() < max_update) {
      std::vector<Batch> batches = stream.next();
      if (sample_ids) sample_ids->write(epoch, controller.num_updates() + 1, stream.last_indices());
      const auto t0 = std::chrono::steady_clock::now();
      const bool applied = !controller.train_update(batches).skipped;
      step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (ddp) wait_s += ddp->last_timing().exposed_s;
      ++i;
      // A skipped update (fp16 overflow) consumed its batches but trained nothing: no progress line.
      if (applied) progress.on_update(epoch, i, total, [&] { return controller.train_stats(); });
      if (ddp && d.log_all_ranks && i % o.common.log_interval == 0) {
        // The straggler report: a rank that computes long and waits little holds the others up.
        log::info("[reducer] update {}: batch size {}, compute {:.1f} ms/update, waiting on communication {:.1f} "
                  "ms/update",
                  controller.num_updates(), batch_sizes[static_cast<size_t>(rank)],
                  1e3 * (step_s - wait_s) / o.common.log_interval, 1e3 * wait_s / o.common.log_interval);
        step_s = wait_s = 0;
      }
      if (applied && !stream.end_of_epoch() && manager.save_due_after_update(controller.num_updates())) {
        const Validation v = validation_on ? run_validation(epoch) : Validation{};
        save(epoch, false, stream.position(), v.metric);
      }
    }
    progress.log(epoch, "train_epoch", controller.train_stats());
    if (!stream.end_of_epoch()) {
      // Stopped inside the epoch (--max-update): a checkpoint to continue from.
      if (last_saved != controller.num_updates() && !ck.save.no_save) {
        const Validation v = validation_on ? run_validation(epoch) : Validation{};
        save(epoch, false, stream.position(), v.metric);
      }
      break;
    }
    Validation v;
    if (validation_on && epoch % o.dataset.validate_interval == 0) v = run_validation(epoch);
    lr = controller.lr_step(epoch, v.loss);
    if (manager.save_due_after_epoch(epoch)) save(epoch, true, IteratorPosition{epoch + 1, 0}, v.metric);
    ++epoch;
  }
  log::info("[train] done: {} updates, epoch {}, {:.1f} s", controller.num_updates(), epoch,
            controller.meters().wall.elapsed_s());
  if (joined) {
    leave_rendezvous(*joined, rdv.timeout);
    // Gloo's process-group teardown has been seen to spin for minutes: leave at once.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(0);
  }
  return 0;
}

int evaluate(int argc, const char* const argv[]) {
  const std::map<std::string, std::string> defaults = task_defaults(find_task_flag(argc, argv));
  auto def = [&](const std::string& name, const std::string& general) {
    auto it = defaults.find(name);
    return cxxopts::value<std::string>()->default_value(it == defaults.end() ? general : it->second);
  };
  cxxopts::Options parser("hetseq-eval", "Evaluates a saved hetseq model on data splits.");
  parser.add_options()
      ("h,help", "show this help and exit")
      ("task", "the task of the model", def("task", ""))
      ("data", "path of the task's data", def("data", ""))
      ("path", "the model file (checkpoint) to evaluate", def("path", "checkpoints/checkpoint_last.pt"))
      ("valid-subset", "comma-separated splits to evaluate", def("valid-subset", "valid"))
      ("max-sentences", "samples per batch", def("max-sentences", "256"))
      ("num-workers", "background threads that build batches", def("num-workers", "1"))
      ("log-format", "none, simple or json", def("log-format", "simple"))
      ("cpu", "use the CPU even when CUDA is available", cxxopts::value<bool>()->default_value("false"))
      ("seed", "seed", def("seed", "19940802"));
  for (const auto& name : TaskRegistry::global().names()) TaskRegistry::global().get(name).add_options(parser);
  cxxopts::ParseResult args = parse_command_line(parser, argc, argv);
  if (args.count("help")) {
    std::cout << parser.help() << std::endl;
    return 0;
  }
  const std::string task_flag = args["task"].as<std::string>();
  if (task_flag.empty()) {
    throw UsageError(fmt::format("--task is required; known tasks: {}", fmt::join(TaskRegistry::global().names(), ", ")));
  }
  const TaskSpec& spec = TaskRegistry::global().get(task_flag);
  const int64_t batch_size = parse_int("--max-sentences", args["max-sentences"].as<std::string>());
  if (batch_size <= 0) throw UsageError("--max-sentences must be positive");
  const int64_t workers = parse_int("--num-workers", args["num-workers"].as<std::string>());
  const LogFormat format = parse_log_format(args["log-format"].as<std::string>());
  TaskContext context;
  context.device = pick_device(args["cpu"].as<bool>());
  context.seed = static_cast<uint64_t>(parse_int("--seed", args["seed"].as<std::string>()));
  std::unique_ptr<Task> task = spec.create(args, context);
  std::shared_ptr<torch::nn::Module> model = task->build_model();
  load_model(*model, args["path"].as<std::string>());
  model->to(context.device);

  auto optimizer = make_optimizer(OptimizationOptions{}, model->parameters());
  auto scheduler = make_lr_scheduler(OptimizationOptions{}, *optimizer);
  ControllerOptions copts;
  copts.device = context.device;
  Controller controller(*task, model, std::move(optimizer), std::move(scheduler), std::make_shared<LocalReducer>(),
                        copts);
  ProgressLogger progress(format, false, 1);
  for (const auto& split : split_names("valid-subset", args["valid-subset"].as<std::string>())) {
    progress.log(0, "valid",
                 controller.valid_stats(validate(controller, task->load_dataset(split), DataPlan::single(batch_size, 1), workers)),
                 split);
  }
  return 0;
}

int run_guarded(int (*body)(int, const char* const*), const char* program, int argc, const char* const argv[]) {
  try {
    return body(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << program << ": error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace

int train_main(int argc, const char* const argv[]) { return run_guarded(train, "hetseq-train", argc, argv); }

int eval_main(int argc, const char* const argv[]) { return run_guarded(evaluate, "hetseq-eval", argc, argv); }

}  // namespace hetseq::cli
