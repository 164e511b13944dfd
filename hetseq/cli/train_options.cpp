#include "hetseq/cli/train_options.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "hetseq/checkpoint/optimizer_overrides.h"
#include "hetseq/core/error.h"
#include "hetseq/core/parse.h"
#include "hetseq/task/task_registry.h"

namespace hetseq::cli {
namespace {

// HetSeq's second spellings of some flags, mapped to the primary one before parsing.
const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> table{
      {"batch-size", "max-sentences"}, {"learning-rate", "lr"}, {"wd", "weight-decay"},
      {"me", "max-epoch"},             {"mu", "max-update"},    {"fa", "force-anneal"},
      {"lr-scheduler", "lr_scheduler"}, {"local_rank", "device-id"},
      {"memory-efficient-fp16", "fp16"}};
  return table;
}

std::string str(const cxxopts::ParseResult& args, const std::string& name) { return args[name].as<std::string>(); }

int64_t integer(const cxxopts::ParseResult& args, const std::string& name) {
  return parse_int("--" + name, str(args, name));
}

int64_t non_negative(const cxxopts::ParseResult& args, const std::string& name) {
  const int64_t v = integer(args, name);
  if (v < 0) throw UsageError(fmt::format("--{}: {} is negative; it must be 0 or more", name, v));
  return v;
}

int64_t positive(const cxxopts::ParseResult& args, const std::string& name) {
  const int64_t v = integer(args, name);
  if (v <= 0) throw UsageError(fmt::format("--{}: {} must be a positive integer", name, v));
  return v;
}

double number(const cxxopts::ParseResult& args, const std::string& name) {
  return parse_double("--" + name, str(args, name));
}

bool flag(const cxxopts::ParseResult& args, const std::string& name) { return args[name].as<bool>(); }

}  // namespace

std::vector<std::string> split_names(const std::string& flag_name, const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) throw UsageError(fmt::format("--{}: '{}' has an empty split name", flag_name, text));
    out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

namespace {
std::string optimizer_overrides_text(const std::vector<std::pair<std::string, double>>& overrides) {
  std::vector<std::string> items;
  for (const auto& [k, v] : overrides) items.push_back(fmt::format("{}={}", k, v));
  return fmt::format("{}", fmt::join(items, ","));
}
}  // namespace

std::string TrainOptions::must_match() const {
  const auto& p = optimization;
  return fmt::format(
      "task={} seed={} train-subset={} curriculum={} optimizer={} lr={} clip-norm={} lr_scheduler={} "
      "warmup-updates={} total-num-update={} end-learning-rate={} power={} max-epoch={} max-update={} "
      "adam-betas=({},{}) adam-eps={} weight-decay={} bucket-cap-mb={} fast-stat-sync={} valid-subset={} "
      "validate-interval={} disable-validation={} save-interval={} save-interval-updates={} no-save={} "
      "optimizer-overrides={} reset-dataloader={} precision={} fp16-init-scale={} fp16-scale-window={} "
      "fp16-scale-tolerance={} min-loss-scale={} threshold-loss-scale={}",
      common.task, common.seed, dataset.train_subset, dataset.curriculum, p.optimizer, fmt::join(p.lr, ","),
      p.clip_norm, p.lr_scheduler, p.warmup_updates, p.total_num_update, p.end_learning_rate, p.power, p.max_epoch,
      p.max_update, p.adam.beta1, p.adam.beta2, p.adam.eps, p.adam.weight_decay, distributed.bucket_cap_mb,
      distributed.fast_stat_sync, fmt::join(dataset.valid_subsets, ","), dataset.validate_interval,
      dataset.disable_validation, checkpoint.save.save_interval, checkpoint.save.save_interval_updates,
      checkpoint.save.no_save, optimizer_overrides_text(checkpoint.optimizer_overrides), checkpoint.reset_dataloader,
      to_string(mixed_precision.precision), mixed_precision.scaler.init_scale,
      mixed_precision.scale_window ? std::to_string(*mixed_precision.scale_window) : "default",
      mixed_precision.scaler.tolerance, mixed_precision.scaler.min_scale,
      mixed_precision.scaler.threshold ? fmt::format("{}", *mixed_precision.scaler.threshold) : "none");
}

int64_t MixedPrecisionOptions::default_scale_window(int64_t micro_batches_per_update) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, micro_batches_per_update));
}

std::optional<std::string> find_task_flag(int argc, const char* const argv[]) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--task" && i + 1 < argc) return std::string(argv[i + 1]);
    if (a.rfind("--task=", 0) == 0) return a.substr(7);
  }
  return std::nullopt;
}

std::map<std::string, std::string> task_defaults(const std::optional<std::string>& task) {
  if (task && TaskRegistry::global().contains(*task)) return TaskRegistry::global().get(*task).defaults;
  return {};
}

cxxopts::Options make_train_parser(const std::optional<std::string>& task) {
  const std::map<std::string, std::string> defaults = task_defaults(task);
  auto def = [&](const std::string& name, const std::string& general) {
    auto it = defaults.find(name);
    return it == defaults.end() ? general : it->second;
  };
  auto text = [&](const std::string& name, const std::string& general) {
    return cxxopts::value<std::string>()->default_value(def(name, general));
  };
  auto opt_text = [&](const std::string& name) {
    auto v = cxxopts::value<std::string>();
    if (defaults.count(name)) v->default_value(defaults.at(name));
    return v;
  };
  auto boolean = [] { return cxxopts::value<bool>()->default_value("false"); };

  cxxopts::Options parser("hetseq-train",
                          "Synchronous data-parallel training across devices of different speed and memory.\n"
                          "Tasks: " + fmt::format("{}", fmt::join(TaskRegistry::global().names(), ", ")));
  parser.set_width(110);
  parser.add_options()
      ("h,help", "show this help (with --task T, also T's flags and defaults) and exit")
      ("task", "the task to train (see Tasks above)", opt_text("task"))
      ("data", "path of the task's data", opt_text("data"))
      ("seed", "pseudo random number generator seed", text("seed", "19940802"))
      ("cpu", "use the CPU even when CUDA is available", boolean())
      ("no-progress-bar", "disable the progress bar", boolean())
      ("log-interval", "log statistics every N updates", text("log-interval", "100"))
      ("log-format", "how statistics are printed: none, simple, json", text("log-format", "simple"))
      ("intra-op-threads", "LibTorch intra-op threads of this process (0: LibTorch's default)",
       text("intra-op-threads", "0"));
  parser.add_options("Mixed precision")
      ("fp16", "forward passes in float16 (autocast) with dynamic loss scaling; weights, gradients and optimizer "
       "stay float32 (alias --memory-efficient-fp16)", boolean())
      ("bf16", "forward passes in bfloat16 (autocast), on CUDA or the CPU; no loss scaling needed", boolean())
      ("fp16-init-scale", "initial loss scale of --fp16, a power of two", text("fp16-init-scale", "128"))
      ("fp16-scale-window", "updates without overflow before the loss scale doubles (default: 16384 / "
       "micro-batches per update over all ranks)", opt_text("fp16-scale-window"))
      ("fp16-scale-tolerance", "share of overflowing updates tolerated before the loss scale halves",
       text("fp16-scale-tolerance", "0"))
      ("min-loss-scale", "stop with an error when the loss scale falls below this", text("min-loss-scale", "1e-4"))
      ("threshold-loss-scale", "the loss scale never halves below this (a power of two)",
       opt_text("threshold-loss-scale"));
  parser.add_options("Dataset and data loading")
      ("num-workers", "background threads that build batches (0: build in the training thread)",
       text("num-workers", "1"))
      ("max-sentences", "samples per batch (alias --batch-size); a comma list gives one per local worker",
       opt_text("max-sentences"))
      ("max-sentences-valid", "samples per validation batch (default: --max-sentences)",
       opt_text("max-sentences-valid"))
      ("required-batch-size-multiple", "round batch sizes down to a multiple of N",
       text("required-batch-size-multiple", "1"))
      ("train-subset", "data split to train on", text("train-subset", "train"))
      ("valid-subset", "comma-separated data splits to validate on", text("valid-subset", "valid"))
      ("validate-interval", "validate every N epochs", text("validate-interval", "1"))
      ("disable-validation", "disable validation", boolean())
      ("curriculum", "don't shuffle batches for the first N epochs", text("curriculum", "0"));
  parser.add_options("Optimization")
      ("max-epoch", "force stop training at this epoch (alias --me; 0: no limit)", text("max-epoch", "0"))
      ("max-update", "force stop training at this update (alias --mu; 0: no limit)", text("max-update", "0"))
      ("clip-norm", "clip threshold of gradients (0: no clipping)", text("clip-norm", "25"))
      ("update-freq", "update parameters every N_i batches in epoch i (comma list N1,N2,...)",
       text("update-freq", "1"))
      ("lr", "learning rate for the first epochs (comma list; alias --learning-rate)", text("lr", "0.25"))
      ("min-lr", "stop training when the learning rate reaches this minimum", text("min-lr", "-1"))
      ("optimizer", "adam, adadelta or sgd", text("optimizer", "adam"));
  parser.add_options("Optimizer")
      ("adam-betas", "betas of Adam, e.g. '(0.9, 0.999)' or 0.9,0.999", text("adam-betas", "(0.9, 0.999)"))
      ("adam-eps", "epsilon of Adam", text("adam-eps", "1e-8"))
      ("weight-decay", "weight decay (alias --wd): decoupled for adam, L2 for sgd", text("weight-decay", "0"))
      ("adadelta_rho", "rho of Adadelta", text("adadelta_rho", "0.9"))
      ("adadelta_eps", "epsilon of Adadelta", text("adadelta_eps", "1e-6"))
      ("adadelta_weight_decay", "L2 weight decay of Adadelta", text("adadelta_weight_decay", "0"))
      ("momentum", "momentum of SGD", text("momentum", "0"));
  parser.add_options("Learning rate scheduler")
      ("lr_scheduler", "PolynomialDecayScheduler, fixed or inverse_sqrt (alias --lr-scheduler)",
       text("lr_scheduler", "PolynomialDecayScheduler"))
      ("force-anneal", "force annealing at this epoch (alias --fa)", opt_text("force-anneal"))
      ("warmup-updates", "warm the learning rate up linearly over the first N updates",
       text("warmup-updates", "0"))
      ("warmup-init-lr", "initial learning rate of the warmup (inverse_sqrt)", opt_text("warmup-init-lr"))
      ("end-learning-rate", "final learning rate (PolynomialDecayScheduler)", text("end-learning-rate", "0"))
      ("power", "decay power (PolynomialDecayScheduler)", text("power", "1"))
      ("total-num-update", "updates over which the rate decays (PolynomialDecayScheduler)",
       text("total-num-update", "1000000"))
      ("lr-shrink", "learning rate shrink factor after --force-anneal (fixed)", text("lr-shrink", "0.1"));
  parser.add_options("Distributed training")
      ("distributed-world-size", "total number of workers across all nodes (default: this node's workers)",
       opt_text("distributed-world-size"))
      ("distributed-rank", "global rank of this node's first worker", text("distributed-rank", "0"))
      ("distributed-gpus", "workers on this node, worker i on device i (default: CUDA devices, or 1)",
       opt_text("distributed-gpus"))
      ("distributed-backend", "gloo or nccl (default: nccl with CUDA, gloo with --cpu or without CUDA)",
       opt_text("distributed-backend"))
      ("distributed-init-method", "tcp://HOST:PORT, file:///shared/path or env:// (Slurm's variables when unset)",
       opt_text("distributed-init-method"))
      ("device-id", "device of this worker (alias --local_rank; set by the launcher)", text("device-id", "0"))
      ("distributed-no-spawn", "run one worker in this process instead of starting --distributed-gpus workers",
       boolean())
      ("distributed-timeout", "seconds to wait for the rendezvous and for each collective",
       text("distributed-timeout", "300"))
      ("bucket-cap-mb", "gradient bucket size in MB", text("bucket-cap-mb", "25"))
      ("find-unused-parameters", "allow models that leave some parameters out of a step", boolean())
      ("fast-stat-sync", "reduce logged statistics in one small allreduce", boolean())
      ("log-all-ranks", "every rank logs, with its batch size, compute and communication-wait times", boolean());
  parser.add_options("Checkpointing")
      ("save-dir", "path to save checkpoints", text("save-dir", "checkpoints"))
      ("restore-file", "checkpoint to resume from: a file name in --save-dir, or a path",
       text("restore-file", "checkpoint_last.pt"))
      ("reset-dataloader", "on resume, start at the first sample of epoch 1 (keep the update count)", boolean())
      ("reset-lr-scheduler", "on resume, don't load the learning rate scheduler state", boolean())
      ("reset-meters", "on resume, don't load the meters", boolean())
      ("reset-optimizer", "on resume, don't load the optimizer state, hyper-parameters or loss scale", boolean())
      ("optimizer-overrides", "on resume, optimizer hyper-parameters to change: key=value,... (e.g. beta2=0.98)",
       text("optimizer-overrides", ""))
      ("save-interval", "save a checkpoint every N epochs", text("save-interval", "1"))
      ("save-interval-updates", "save a checkpoint (and validate) every N updates (0: off)",
       text("save-interval-updates", "0"))
      ("keep-interval-updates", "keep only the last N checkpoints of --save-interval-updates (-1: all)",
       text("keep-interval-updates", "-1"))
      ("keep-last-epochs", "keep only the last N epoch checkpoints (-1: all)", text("keep-last-epochs", "-1"))
      ("no-save", "don't save models or checkpoints", boolean())
      ("no-epoch-checkpoints", "only store the last and best checkpoints", boolean())
      ("no-last-checkpoints", "don't store the last checkpoint", boolean())
      ("no-save-optimizer-state", "don't save the optimizer state in checkpoints", boolean())
      ("best-checkpoint-metric", "validation statistic that picks checkpoint_best.pt", text("best-checkpoint-metric", "loss"))
      ("maximize-best-checkpoint-metric", "a larger --best-checkpoint-metric is better", boolean())
      ("dump-sample-ids", "debugging: each rank appends the sample indices of every update to DIR/samples-rankR.txt",
       opt_text("dump-sample-ids"));
  for (const auto& name : TaskRegistry::global().names()) TaskRegistry::global().get(name).add_options(parser);
  return parser;
}

cxxopts::ParseResult parse_command_line(cxxopts::Options& parser, int argc, const char* const argv[]) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) != 0) continue;
    const size_t eq = args[i].find('=');
    const std::string name = args[i].substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    auto it = aliases().find(name);
    if (it != aliases().end()) args[i] = "--" + it->second + (eq == std::string::npos ? "" : args[i].substr(eq));
  }
  std::vector<const char*> ptrs;
  for (const auto& a : args) ptrs.push_back(a.c_str());
  try {
    cxxopts::ParseResult result = parser.parse(static_cast<int>(ptrs.size()), ptrs.data());
    if (!result.unmatched().empty()) {
      throw UsageError(fmt::format("unexpected argument '{}'; every value belongs to a --flag (see --help)",
                                   result.unmatched().front()));
    }
    return result;
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see --help)", e.what()));
  }
}

TrainOptions read_train_options(const cxxopts::ParseResult& args) {
  TrainOptions o;
  try {
    auto& c = o.common;
    if (!args.count("task") && !args["task"].has_default()) {
      throw UsageError(fmt::format("--task is required; known tasks: {}",
                                   fmt::join(TaskRegistry::global().names(), ", ")));
    }
    c.task = str(args, "task");
    TaskRegistry::global().get(c.task);  // throws on an unknown task
    const int64_t seed = integer(args, "seed");
    if (seed < 0) throw UsageError(fmt::format("--seed: {} is negative", seed));
    c.seed = static_cast<uint64_t>(seed);
    c.cpu = flag(args, "cpu");
    c.no_progress_bar = flag(args, "no-progress-bar");
    c.log_interval = positive(args, "log-interval");
    c.log_format = parse_log_format(str(args, "log-format"));
    c.intra_op_threads = non_negative(args, "intra-op-threads");

    auto& m = o.mixed_precision;
    const bool fp16 = flag(args, "fp16"), bf16 = flag(args, "bf16");
    if (fp16 && bf16) throw UsageError("--fp16 and --bf16 exclude each other; pick one");
    m.precision = fp16 ? Precision::kFloat16 : bf16 ? Precision::kBFloat16 : Precision::kFloat32;
    for (const char* name : {"fp16-init-scale", "fp16-scale-window", "fp16-scale-tolerance", "min-loss-scale",
                             "threshold-loss-scale"}) {
      if (!fp16 && args.count(name)) {
        throw UsageError(fmt::format("--{} sets the loss scaling of --fp16; add --fp16 or leave it out", name));
      }
    }
    m.scaler.init_scale = number(args, "fp16-init-scale");
    if (args.count("fp16-scale-window")) m.scale_window = positive(args, "fp16-scale-window");
    m.scaler.tolerance = number(args, "fp16-scale-tolerance");
    m.scaler.min_scale = number(args, "min-loss-scale");
    if (args.count("threshold-loss-scale")) m.scaler.threshold = number(args, "threshold-loss-scale");
    if (fp16) m.scaler.validate();

    auto& d = o.dataset;
    d.num_workers = non_negative(args, "num-workers");
    if (!args.count("max-sentences") && !args["max-sentences"].has_default()) {
      throw UsageError("--max-sentences (or --batch-size) is required: the number of samples per batch");
    }
    d.max_sentences = parse_int_list("--max-sentences", str(args, "max-sentences"));
    for (int64_t b : d.max_sentences) {
      if (b <= 0) throw UsageError(fmt::format("--max-sentences: {} must be a positive integer", b));
    }
    if (args.count("max-sentences-valid") || args["max-sentences-valid"].has_default()) {
      d.max_sentences_valid = positive(args, "max-sentences-valid");
    }
    d.required_batch_size_multiple = positive(args, "required-batch-size-multiple");
    d.train_subset = str(args, "train-subset");
    d.valid_subsets = split_names("valid-subset", str(args, "valid-subset"));
    d.validate_interval = positive(args, "validate-interval");
    d.disable_validation = flag(args, "disable-validation");
    d.curriculum = non_negative(args, "curriculum");

    auto& p = o.optimization;
    p.max_epoch = non_negative(args, "max-epoch");
    p.max_update = non_negative(args, "max-update");
    p.clip_norm = number(args, "clip-norm");
    if (p.clip_norm < 0) throw UsageError(fmt::format("--clip-norm: {} is negative; 0 turns clipping off", p.clip_norm));
    p.update_freq = parse_int_list("--update-freq", str(args, "update-freq"));
    for (int64_t u : p.update_freq) {
      if (u <= 0) throw UsageError(fmt::format("--update-freq: {} must be a positive integer", u));
    }
    p.lr = parse_double_list("--lr", str(args, "lr"));
    for (double lr : p.lr) {
      if (lr < 0) throw UsageError(fmt::format("--lr: {} is negative", lr));
    }
    p.min_lr = number(args, "min-lr");
    p.optimizer = str(args, "optimizer");
    if (p.optimizer != "adam" && p.optimizer != "adadelta" && p.optimizer != "sgd") {
      throw UsageError(fmt::format("--optimizer: '{}' is not one of adam, adadelta, sgd", p.optimizer));
    }
    const auto betas = parse_double_list("--adam-betas", str(args, "adam-betas"));
    if (betas.size() != 2) {
      throw UsageError(fmt::format("--adam-betas: expected two values like '(0.9, 0.999)', got {}", betas.size()));
    }
    p.adam.lr = p.lr.front();
    p.adam.beta1 = betas[0];
    p.adam.beta2 = betas[1];
    p.adam.eps = number(args, "adam-eps");
    p.adam.weight_decay = number(args, "weight-decay");
    p.adadelta.lr = p.lr.front();
    p.adadelta.rho = number(args, "adadelta_rho");
    p.adadelta.eps = number(args, "adadelta_eps");
    p.adadelta.weight_decay = number(args, "adadelta_weight_decay");
    p.sgd.lr = p.lr.front();
    p.sgd.momentum = number(args, "momentum");
    p.sgd.weight_decay = number(args, "weight-decay");
    p.lr_scheduler = str(args, "lr_scheduler");
    if (p.lr_scheduler != "PolynomialDecayScheduler" && p.lr_scheduler != "fixed" && p.lr_scheduler != "inverse_sqrt") {
      throw UsageError(fmt::format("--lr_scheduler: '{}' is not one of PolynomialDecayScheduler, fixed, inverse_sqrt",
                                   p.lr_scheduler));
    }
    if (args.count("force-anneal") || args["force-anneal"].has_default()) p.force_anneal = positive(args, "force-anneal");
    p.warmup_updates = non_negative(args, "warmup-updates");
    if (args.count("warmup-init-lr") || args["warmup-init-lr"].has_default()) {
      p.warmup_init_lr = number(args, "warmup-init-lr");
    }
    p.end_learning_rate = number(args, "end-learning-rate");
    p.power = number(args, "power");
    p.total_num_update = positive(args, "total-num-update");
    p.lr_shrink = number(args, "lr-shrink");

    auto& g = o.distributed;
    if (args.count("distributed-world-size") || args["distributed-world-size"].has_default()) {
      g.world_size = positive(args, "distributed-world-size");
    }
    g.rank = non_negative(args, "distributed-rank");
    g.rank_given = args.count("distributed-rank") > 0;
    if (args.count("distributed-gpus") || args["distributed-gpus"].has_default()) g.gpus = positive(args, "distributed-gpus");
    if (args.count("distributed-backend")) {
      g.backend = str(args, "distributed-backend");
      if (g.backend != "gloo" && g.backend != "nccl") {
        throw UsageError(fmt::format("--distributed-backend: '{}' is not one of gloo, nccl", g.backend));
      }
    }
    if (args.count("distributed-init-method")) g.init_method = str(args, "distributed-init-method");
    g.device_id = non_negative(args, "device-id");
    g.no_spawn = flag(args, "distributed-no-spawn");
    g.timeout_s = positive(args, "distributed-timeout");
    g.bucket_cap_mb = number(args, "bucket-cap-mb");
    if (g.bucket_cap_mb <= 0) throw UsageError(fmt::format("--bucket-cap-mb: {} must be positive", g.bucket_cap_mb));
    g.find_unused_parameters = flag(args, "find-unused-parameters");
    g.fast_stat_sync = flag(args, "fast-stat-sync");
    g.log_all_ranks = flag(args, "log-all-ranks");

    auto& k = o.checkpoint;
    k.save.save_dir = str(args, "save-dir");
    k.save.no_save = flag(args, "no-save");
    k.save.save_interval = positive(args, "save-interval");
    k.save.save_interval_updates = integer(args, "save-interval-updates");
    if (k.save.save_interval_updates < 0) throw UsageError("--save-interval-updates must be >= 0 (0: off)");
    k.save.keep_interval_updates = integer(args, "keep-interval-updates");
    k.save.keep_last_epochs = integer(args, "keep-last-epochs");
    for (const char* name : {"keep-interval-updates", "keep-last-epochs"}) {
      if (integer(args, name) < -1 || integer(args, name) == 0) {
        throw UsageError(fmt::format("--{} must be a positive number of checkpoints, or -1 to keep all", name));
      }
    }
    k.save.no_epoch_checkpoints = flag(args, "no-epoch-checkpoints");
    k.save.no_last_checkpoints = flag(args, "no-last-checkpoints");
    k.save.no_save_optimizer_state = flag(args, "no-save-optimizer-state");
    k.save.best_checkpoint_metric = str(args, "best-checkpoint-metric");
    if (k.save.best_checkpoint_metric.empty()) throw UsageError("--best-checkpoint-metric: empty name");
    k.save.maximize_best_checkpoint_metric = flag(args, "maximize-best-checkpoint-metric");
    k.restore_file = str(args, "restore-file");
    if (k.restore_file.empty()) throw UsageError("--restore-file: empty path");
    k.restore_file_given = args.count("restore-file") != 0;
    k.reset_dataloader = flag(args, "reset-dataloader");
    k.reset_lr_scheduler = flag(args, "reset-lr-scheduler");
    k.reset_meters = flag(args, "reset-meters");
    k.reset_optimizer = flag(args, "reset-optimizer");
    k.optimizer_overrides = parse_optimizer_overrides(str(args, "optimizer-overrides"));
    if (args.count("dump-sample-ids")) k.dump_sample_ids = str(args, "dump-sample-ids");
    if (o.checkpoint.save.save_dir.empty()) throw UsageError("--save-dir: empty path");
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see --help)", e.what()));
  }
  return o;
}

}  // namespace hetseq::cli
