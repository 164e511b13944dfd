#include "hetseq/cli/train_options.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "hetseq/optim/optimizer_overrides.h"
#include "hetseq/core/error.h"
#include "hetseq/cli/flags.h"
#include "hetseq/cli/nearest_flag.h"
#include "hetseq/core/parse.h"
#include "hetseq/cli/per_rank_flags.h"
#include "hetseq/observe/tracer.h"
#include "hetseq/optim/registry.h"
#include "hetseq/task/task_registry.h"
#include "hetseq/task/user_dir.h"

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

int64_t non_negative(const cxxopts::ParseResult& args, const std::string& name) {
  const int64_t v = flag_integer(args, name);
  if (v < 0) throw UsageError(fmt::format("--{}: {} is negative; it must be 0 or more", name, v));
  return v;
}

int64_t positive(const cxxopts::ParseResult& args, const std::string& name) {
  const int64_t v = flag_integer(args, name);
  if (v <= 0) throw UsageError(fmt::format("--{}: {} must be a positive integer", name, v));
  return v;
}

bool flag(const cxxopts::ParseResult& args, const std::string& name) { return args[name].as<bool>(); }

// The long names of every flag of `parser`, in its groups' order.
std::vector<std::string> long_flag_names(const cxxopts::Options& parser) {
  std::vector<std::string> names;
  for (const auto& group : parser.groups()) {
    for (const auto& option : parser.group_help(group).options) names.insert(names.end(), option.l.begin(), option.l.end());
  }
  return names;
}

// The error for the first `--name` of `args` (aliases resolved) that `parser` does not know, with the
// known flags nearest to it (Note [Nearest flag]); `cxxopts_message` when none is found.
std::string unknown_flag_message(const cxxopts::Options& parser, const std::vector<std::string>& args,
                                 const std::string& cxxopts_message) {
  const std::vector<std::string> known = long_flag_names(parser);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;
    if (args[i].rfind("--", 0) != 0) continue;
    const size_t eq = args[i].find('=');
    const std::string name = args[i].substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    const std::vector<std::string> near = nearest_flags(name, known);
    if (near.empty()) return fmt::format("unknown flag --{} (see --help)", name);
    std::vector<std::string> dashed;
    for (const auto& n : near) dashed.push_back("--" + n);
    return fmt::format("unknown flag --{}; did you mean {}? (see --help)", name, fmt::join(dashed, " or "));
  }
  return fmt::format("{} (see --help)", cxxopts_message);
}

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

std::optional<std::string> find_task_flag(int argc, const char* const argv[]) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--task" && i + 1 < argc) return std::string(argv[i + 1]);
    if (a.rfind("--task=", 0) == 0) return a.substr(7);
  }
  return std::nullopt;
}

void load_user_dirs(int argc, const char* const argv[]) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--user-dir") {
      if (i + 1 >= argc) throw UsageError("--user-dir needs a value: the task library or its folder");
      load_user_dir(argv[++i]);
    } else if (a.rfind("--user-dir=", 0) == 0) {
      load_user_dir(a.substr(11));
    }
  }
  TaskRegistry::global().check_registrations();
}

std::map<std::string, std::string> task_defaults(const std::optional<std::string>& task) {
  if (task && TaskRegistry::global().contains(*task)) return TaskRegistry::global().get(*task).defaults;
  return {};
}

namespace {

// The defaults of the task named by --task, as every flag group declares its flags with them.
DefaultOf task_default_of(const std::optional<std::string>& task) { return defaults_from(task_defaults(task)); }

}  // namespace

void add_common_flags(cxxopts::Options& parser, const std::optional<std::string>& task) {
  const DefaultOf d = task_default_of(task);
  parser.add_options()
      ("h,help", "show this help (with --task T, also T's flags and defaults) and exit")
      ("task", "the task to train (see Tasks above)", optional_flag(d, "task"))
      ("user-dir", "a task library built outside this tree (lib<task>.so, or a folder of them), loaded before "
                   "--task is looked up; its flags then show with --task NAME --help",
       cxxopts::value<std::string>(), "PATH")
      ("data", "path of the task's data", optional_flag(d, "data"))
      ("seed", "pseudo random number generator seed", text_flag(d, "seed", "19940802"))
      ("cpu", "use the CPU even when CUDA is available", switch_flag())
      ("no-progress-bar", "disable the progress bar", switch_flag())
      ("log-interval", "log statistics every N updates", text_flag(d, "log-interval", "100"))
      ("log-format", "how statistics are printed: none, simple, json", text_flag(d, "log-format", "simple"))
      ("intra-op-threads", "LibTorch intra-op threads of this process (0: LibTorch's default)",
       text_flag(d, "intra-op-threads", "0"))
      ("deterministic", "on a GPU, deterministic cuDNN and cuBLAS kernels, so that a run and its resume are "
       "bit-equal there (slower)", switch_flag())
      ("cuda-graph", "on a GPU, a world of one: capture an update's forward, backward and clipping into a CUDA graph "
       "and replay it, for batches of one shape (the task pads them to it); where a run cannot, one line says why "
       "and it trains uncaptured", switch_flag());
}

void add_precision_flags(cxxopts::Options& parser, const std::optional<std::string>& task) {
  const DefaultOf d = task_default_of(task);
  parser.add_options("Mixed precision")
      ("fp16", "forward passes in float16 (autocast) with dynamic loss scaling; weights, gradients and optimizer "
       "stay float32 (alias --memory-efficient-fp16)", switch_flag())
      ("bf16", "forward passes in bfloat16 (autocast), on CUDA or the CPU; no loss scaling needed", switch_flag())
      ("fp16-init-scale", "initial loss scale of --fp16, a power of two", text_flag(d, "fp16-init-scale", "128"))
      ("fp16-scale-window", "updates without overflow before the loss scale doubles (default: 16384 / "
       "micro-batches per update over all ranks)", optional_flag(d, "fp16-scale-window"))
      ("fp16-scale-tolerance", "share of overflowing updates tolerated before the loss scale halves",
       text_flag(d, "fp16-scale-tolerance", "0"))
      ("min-loss-scale", "stop with an error when the loss scale falls below this", text_flag(d, "min-loss-scale", "1e-4"))
      ("threshold-loss-scale", "the loss scale never halves below this (a power of two)",
       optional_flag(d, "threshold-loss-scale"));
}

void add_dataset_flags(cxxopts::Options& parser, const std::optional<std::string>& task) {
  const DefaultOf d = task_default_of(task);
  parser.add_options("Dataset and data loading")
      ("num-workers", "background threads that build batches (0: build in the training thread)",
       text_flag(d, "num-workers", "1"))
      ("max-sentences", "samples per batch (alias --batch-size); a comma list gives one per local worker",
       optional_flag(d, "max-sentences"))
      ("max-sentences-valid", "samples per validation batch (default: --max-sentences)",
       optional_flag(d, "max-sentences-valid"))
      ("required-batch-size-multiple", "round batch sizes down to a multiple of N",
       text_flag(d, "required-batch-size-multiple", "1"))
      ("train-subset", "data split to train on", text_flag(d, "train-subset", "train"))
      ("valid-subset", "comma-separated data splits to validate on", text_flag(d, "valid-subset", "valid"))
      ("validate-interval", "validate every N epochs", text_flag(d, "validate-interval", "1"))
      ("disable-validation", "disable validation", switch_flag())
      ("curriculum", "don't shuffle batches for the first N epochs", text_flag(d, "curriculum", "0"));
}

void add_optimization_flags(cxxopts::Options& parser, const std::optional<std::string>& task) {
  const DefaultOf d = task_default_of(task);
  parser.add_options("Optimization")
      ("max-epoch", "force stop training at this epoch (alias --me; 0: no limit)", text_flag(d, "max-epoch", "0"))
      ("max-update", "force stop training at this update (alias --mu; 0: no limit)", text_flag(d, "max-update", "0"))
      ("clip-norm", "clip threshold of gradients (0: no clipping)", text_flag(d, "clip-norm", "25"))
      ("update-freq", "update parameters every N_i batches in epoch i (comma list N1,N2,...)",
       text_flag(d, "update-freq", "1"))
      ("lr", "learning rate for the first epochs (comma list; alias --learning-rate)", text_flag(d, "lr", "0.25"))
      ("min-lr", "stop training when the learning rate reaches this minimum", text_flag(d, "min-lr", "-1"))
      ("optimizer", fmt::format("{}", fmt::join(optim::optimizers().names(), ", ")), text_flag(d, "optimizer", "adam"))
      ("weight-decay", "weight decay (alias --wd): decoupled for adam, L2 for sgd", text_flag(d, "weight-decay", "0"));
  parser.add_options("Learning rate scheduler")
      ("lr_scheduler", fmt::format("{} (alias --lr-scheduler)", fmt::join(optim::lr_schedulers().names(), ", ")),
       text_flag(d, "lr_scheduler", "PolynomialDecayScheduler"))
      ("force-anneal", "force annealing at this epoch (alias --fa)", optional_flag(d, "force-anneal"))
      ("warmup-updates", "warm the learning rate up linearly over the first N updates",
       text_flag(d, "warmup-updates", "0"));
  FlagSet optimizer_flags("Optimizer"), schedule_flags("Learning rate scheduler");
  optim::optimizers().declare_flags(optimizer_flags);
  optim::lr_schedulers().declare_flags(schedule_flags);
  add_flag_set(parser, optimizer_flags, d);
  add_flag_set(parser, schedule_flags, d);
}

void add_distributed_flags(cxxopts::Options& parser, const std::optional<std::string>& task) {
  const DefaultOf d = task_default_of(task);
  parser.add_options("Distributed training")
      ("distributed-world-size", "total number of workers across all nodes (default: this node's workers)",
       optional_flag(d, "distributed-world-size"))
      ("distributed-rank", "global rank of this node's first worker", text_flag(d, "distributed-rank", "0"))
      ("distributed-gpus", "workers on this node, worker i on device i (default: CUDA devices, or 1)",
       optional_flag(d, "distributed-gpus"))
      ("distributed-backend", "gloo or nccl (default: nccl with CUDA, gloo with --cpu or without CUDA)",
       optional_flag(d, "distributed-backend"))
      ("distributed-init-method", "tcp://HOST:PORT, file:///shared/path or env:// (Slurm's variables when unset)",
       optional_flag(d, "distributed-init-method"))
      ("device-id", "device of this worker (alias --local_rank; set by the launcher)", text_flag(d, "device-id", "0"))
      ("distributed-no-spawn", "run one worker in this process instead of starting --distributed-gpus workers",
       switch_flag())
      ("distributed-timeout", "seconds a collective may wait for a peer before the run fails (a lost peer)",
       text_flag(d, "distributed-timeout", "300"))
      ("rendezvous-timeout", "seconds to wait for every rank to arrive at the start, and at the end (default: "
       "--distributed-timeout)", optional_flag(d, "rendezvous-timeout"))
      ("checkpoint-timeout", "seconds the other ranks wait for rank 0 to write a checkpoint; they fail sooner, "
       "after --distributed-timeout, only if a rank that writes stops showing progress (it died or hangs)",
       text_flag(d, "checkpoint-timeout", "3600"))
      ("debug-collectives", "check every collective across the ranks (operation, sizes, dtypes) before it runs, so "
       "a mismatch is an error naming the rank instead of a hang; slower", switch_flag())
      ("bucket-cap-mb", "gradient bucket size in MB", text_flag(d, "bucket-cap-mb", "25"))
      ("find-unused-parameters", "allow models that leave some parameters out of a step", switch_flag())
      ("broadcast-buffers", "broadcast the model's buffers from rank 0 before each update's forward passes "
       "(--broadcast-buffers=false to keep each rank's own)", cxxopts::value<bool>()->default_value("true"))
      ("fast-stat-sync", "reduce logged statistics in one small allreduce", switch_flag())
      ("zero-sharding", "none, or os: each rank keeps the optimizer state of a contiguous shard of the parameters, "
       "sized by --memory-budget, and the updated shards are gathered (the same training as none)",
       text_flag(d, "zero-sharding", "none"))
      ("memory-budget", "GB (2^30 bytes) of memory this rank offers for training; under --zero-sharding os shards are "
       "proportional to the ranks' budgets (default: the free memory: CUDA's free device memory, or MemAvailable "
       "and the cgroup limit). A rank whose parameters, gradients, optimizer state (shard) and measured activations "
       "do not fit stops before training, naming the bytes", optional_flag(d, "memory-budget"))
      ("ddp-comm-hook", "how gradient buckets travel: none (float32, exact), fp16 or bf16 (half the bytes, "
       "rounded to the format), powersgd (low-rank, --powersgd-rank)", text_flag(d, "ddp-comm-hook", "none"))
      ("shared-memory-reduce", "auto, on or off: ranks of one machine sum their CPU gradient buckets through "
       "shared memory instead of the process group's loopback TCP (auto: when every rank runs on this machine, "
       "with --ddp-comm-hook none and room in /dev/shm)", text_flag(d, "shared-memory-reduce", "auto"))
      ("powersgd-rank", "rank of PowerSGD's approximation of each gradient matrix", text_flag(d, "powersgd-rank", "1"))
      ("powersgd-start-update", "updates reduced uncompressed before PowerSGD starts (warm-up)",
       text_flag(d, "powersgd-start-update", "100"))
      ("log-all-ranks", "every rank logs, and the per-rank summary (batch size, compute, communication wait, bus "
       "bandwidth, slowest rank) is printed every --log-interval, not only at the end of each epoch", switch_flag());
}

void add_balance_flags(cxxopts::Options& parser, const std::optional<std::string>& task) {
  const DefaultOf d = task_default_of(task);
  parser.add_options("Balancing")
      ("auto-balance", "move each update's samples between ranks so that all finish their compute together; the "
       "samples per update (and so the training) stay what --max-sentences and --update-freq make them",
       switch_flag())
      ("balance-interval", "updates between two re-plans of the split", text_flag(d, "balance-interval", "10"))
      ("balance-threshold", "apply a new split only when it is predicted faster by more than this share of the "
       "step time (default 0.03, widened to twice the measured noise; a value given is used as is)",
       text_flag(d, "balance-threshold", "0.03"))
      ("balance-cap", "largest micro-batch a worker may run when balancing (memory); a larger share runs as "
       "several micro-batches. A comma list gives one per local worker (default: no limit)",
       optional_flag(d, "balance-cap"));
}

void add_checkpoint_flags(cxxopts::Options& parser, const std::optional<std::string>& task) {
  const DefaultOf d = task_default_of(task);
  parser.add_options("Checkpointing")
      ("save-dir", "path to save checkpoints", text_flag(d, "save-dir", "checkpoints"))
      ("restore-file", "checkpoint to resume from: a file name in --save-dir, or a path",
       text_flag(d, "restore-file", "checkpoint_last.pt"))
      ("reset-dataloader", "on resume, start at the first sample of epoch 1 (keep the update count)", switch_flag())
      ("reset-lr-scheduler", "on resume, don't load the learning rate scheduler state", switch_flag())
      ("reset-meters", "on resume, don't load the meters", switch_flag())
      ("reset-optimizer", "on resume, don't load the optimizer state, hyper-parameters or loss scale", switch_flag())
      ("optimizer-overrides", "on resume, optimizer hyper-parameters to change: key=value,... (e.g. beta2=0.98)",
       text_flag(d, "optimizer-overrides", ""))
      ("save-interval", "save a checkpoint every N epochs", text_flag(d, "save-interval", "1"))
      ("save-interval-updates", "save a checkpoint (and validate) every N updates (0: off)",
       text_flag(d, "save-interval-updates", "0"))
      ("keep-interval-updates", "keep only the last N checkpoints of --save-interval-updates (-1: all)",
       text_flag(d, "keep-interval-updates", "-1"))
      ("keep-last-epochs", "keep only the last N epoch checkpoints (-1: all)", text_flag(d, "keep-last-epochs", "-1"))
      ("no-save", "don't save models or checkpoints", switch_flag())
      ("no-epoch-checkpoints", "only store the last and best checkpoints", switch_flag())
      ("no-last-checkpoints", "don't store the last checkpoint", switch_flag())
      ("no-save-optimizer-state", "don't save the optimizer state in checkpoints", switch_flag())
      ("best-checkpoint-metric", "validation statistic that picks checkpoint_best.pt", text_flag(d, "best-checkpoint-metric", "loss"))
      ("maximize-best-checkpoint-metric", "a larger --best-checkpoint-metric is better", switch_flag())
      ("dump-sample-ids", "debugging: each rank appends the sample indices of every update to DIR/samples-rankR.txt",
       optional_flag(d, "dump-sample-ids"));
}

void add_observe_flags(cxxopts::Options& parser, const std::optional<std::string>& task) {
  const DefaultOf d = task_default_of(task);
  parser.add_options("Seeing a run")
      ("trace-dir", "each rank writes the timeline of --trace-updates to DIR/trace_rank<R>.json (Chrome trace "
       "format: Perfetto, chrome://tracing); `hetseq-trace merge DIR` joins the ranks", optional_flag(d, "trace-dir"))
      ("trace-updates", "the updates to trace with --trace-dir, A:B (1-based, both included)",
       text_flag(d, "trace-updates", "1:100"))
      ("trace-ops", "with --trace-dir, also LibTorch's op-level profile (Kineto) of the same updates, in "
       "DIR/ops_rank<R>.json", switch_flag())
      ("step-profile", "measure the steady state: let WARMUP updates pass, then time TIMED updates and print one JSON "
       "line (tag step_profile: samples/s, data wait, host and device ms, ATen operators and host reads per "
       "update, peak memory; rank 0)", optional_flag(d, "step-profile"), "WARMUP,TIMED")
      ("tensorboard-logdir", "write the log's statistics as TensorBoard scalars into DIR (rank 0)",
       optional_flag(d, "tensorboard-logdir"))
      ("json-log", "append every log record as a JSON line to FILE, whatever --log-format prints (rank 0); "
       "scripts/plot_run.py draws it", optional_flag(d, "json-log"));
}

cxxopts::Options make_train_parser(const std::optional<std::string>& task) {
  cxxopts::Options parser("hetseq-train",
                          "Synchronous data-parallel training across devices of different speed and memory.\n"
                          "Tasks: " + fmt::format("{}", fmt::join(TaskRegistry::global().names(), ", ")));
  parser.set_width(110);
  for (auto add : {add_common_flags, add_precision_flags, add_dataset_flags, add_optimization_flags,
                   add_distributed_flags, add_balance_flags, add_checkpoint_flags, add_observe_flags}) {
    add(parser, task);
  }
  add_task_flags(parser, task);
  return parser;
}

void add_flag_set(cxxopts::Options& parser, const FlagSet& flags, const DefaultOf& default_of,
                  std::set<std::string>* declared) {
  auto add = parser.add_options(flags.group());
  for (const FlagSpec& f : flags.flags()) {
    if (declared != nullptr && !declared->insert(f.name).second) continue;
    const std::optional<std::string> task_default = default_of ? default_of(f.name) : std::nullopt;
    const std::optional<std::string> text = task_default ? task_default : f.default_text;
    if (f.is_switch) {
      add(f.name, f.help, switch_flag());
    } else if (text) {
      add(f.name, f.help, cxxopts::value<std::string>()->default_value(*text), f.value_name);
    } else {
      add(f.name, f.help, cxxopts::value<std::string>(), f.value_name);
    }
  }
}

// Note [A task's flags are its own]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Tasks are written apart (in the tree, or as a --user-dir library), so two of them may declare the same
// flag name with their own default and help: MNIST's --hidden-units is 128, a library's may be 32. The
// parser holds one option per name, so the task that --task names declares its flags first and the
// others skip the names it took; its defaults and help are then the ones parsed and shown (--task X
// --help). Without --task, or for a name no other task shares, the order is the registry's (by name).
// A task's program of its own (hetseq::main with the task linked in) and hetseq-train with the same task
// as a --user-dir library therefore train the same model.
void add_task_flags(cxxopts::Options& parser, const std::optional<std::string>& task) {
  std::vector<std::string> order = TaskRegistry::global().names();
  if (task && TaskRegistry::global().contains(*task)) {
    order.erase(std::find(order.begin(), order.end(), *task));
    order.insert(order.begin(), *task);
  }
  std::set<std::string> declared;  // a flag two tasks declare is declared once: see Note [A task's flags are its own]
  for (const auto& name : order) {
    const TaskSpec& spec = TaskRegistry::global().get(name);
    if (!spec.flags) continue;
    FlagSet set(spec.group());
    spec.flags(set);
    add_flag_set(parser, set, nullptr, &declared);
  }
}

FlagValues flag_values(const cxxopts::ParseResult& args) {
  // What cxxopts defaulted, then what was given (the last time a flag appears), as text: a flag may be
  // declared with any value type (cxxopts::value<int64_t>), so the value is never read back as a string;
  // a switch given reads "true".
  std::map<std::string, std::string> texts;
  for (const auto& defaulted : args.defaults()) texts[defaulted.key()] = defaulted.value();
  for (const auto& given : args.arguments()) texts[given.key()] = given.value();
  return FlagValues(std::move(texts));
}

std::vector<std::string> resolve_aliases(int argc, const char* const argv[]) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) != 0) continue;
    const size_t eq = args[i].find('=');
    const std::string name = args[i].substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    auto it = aliases().find(name);
    if (it != aliases().end()) args[i] = "--" + it->second + (eq == std::string::npos ? "" : args[i].substr(eq));
  }
  return args;
}

cxxopts::ParseResult parse_command_line(cxxopts::Options& parser, int argc, const char* const argv[]) {
  const std::vector<std::string> args = resolve_aliases(argc, argv);
  std::vector<const char*> ptrs;
  for (const auto& a : args) ptrs.push_back(a.c_str());
  try {
    cxxopts::ParseResult result = parser.parse(static_cast<int>(ptrs.size()), ptrs.data());
    if (!result.unmatched().empty()) {
      throw UsageError(fmt::format("unexpected argument '{}'; every value belongs to a --flag (see --help)",
                                   result.unmatched().front()));
    }
    return result;
  } catch (const cxxopts::exceptions::no_such_option& e) {
    throw UsageError(unknown_flag_message(parser, args, e.what()));
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see --help)", e.what()));
  }
}

std::map<std::string, std::string> compared_flags(const cxxopts::Options& parser, const cxxopts::ParseResult& args) {
  const FlagValues values = flag_values(args);
  std::map<std::string, std::string> out;
  for (const auto& group : parser.groups()) {
    for (const auto& option : parser.group_help(group).options) {
      const std::string& name = option.l.empty() ? option.s : option.l.front();
      if (per_rank_flags().count(name)) continue;
      out["--" + name] = values.text_or(name, "(not set)");
    }
  }
  return out;
}

CommonOptions read_common(const cxxopts::ParseResult& args) {
  CommonOptions c;
  if (!flag_set(args, "task")) {
    throw UsageError(fmt::format("--task is required; known tasks: {}",
                                 fmt::join(TaskRegistry::global().names(), ", ")));
  }
  c.task = str(args, "task");
  TaskRegistry::global().get(c.task);  // throws on an unknown task
  const int64_t seed = flag_integer(args, "seed");
  if (seed < 0) throw UsageError(fmt::format("--seed: {} is negative", seed));
  c.seed = static_cast<uint64_t>(seed);
  c.cpu = flag(args, "cpu");
  c.no_progress_bar = flag(args, "no-progress-bar");
  c.log_interval = positive(args, "log-interval");
  c.log_format = parse_log_format(str(args, "log-format"));
  c.intra_op_threads = non_negative(args, "intra-op-threads");
  c.deterministic = flag(args, "deterministic");
  c.cuda_graph = flag(args, "cuda-graph");
  return c;
}

MixedPrecisionOptions read_precision(const cxxopts::ParseResult& args) {
  MixedPrecisionOptions m;
  const bool fp16 = flag(args, "fp16"), bf16 = flag(args, "bf16");
  if (fp16 && bf16) throw UsageError("--fp16 and --bf16 exclude each other; pick one");
  m.precision = fp16 ? Precision::kFloat16 : bf16 ? Precision::kBFloat16 : Precision::kFloat32;
  for (const char* name : {"fp16-init-scale", "fp16-scale-window", "fp16-scale-tolerance", "min-loss-scale",
                           "threshold-loss-scale"}) {
    if (!fp16 && args.count(name)) {
      throw UsageError(fmt::format("--{} sets the loss scaling of --fp16; add --fp16 or leave it out", name));
    }
  }
  m.scaler.init_scale = flag_number(args, "fp16-init-scale");
  if (args.count("fp16-scale-window")) m.scale_window = positive(args, "fp16-scale-window");
  m.scaler.tolerance = flag_number(args, "fp16-scale-tolerance");
  m.scaler.min_scale = flag_number(args, "min-loss-scale");
  if (args.count("threshold-loss-scale")) m.scaler.threshold = flag_number(args, "threshold-loss-scale");
  if (fp16) m.scaler.validate();
  return m;
}

namespace {

DatasetOptions read_dataset(const cxxopts::ParseResult& args) {
  DatasetOptions d;
  d.num_workers = non_negative(args, "num-workers");
  if (!flag_set(args, "max-sentences")) {
    throw UsageError("--max-sentences (or --batch-size) is required: the number of samples per batch");
  }
  d.max_sentences = parse_int_list("--max-sentences", str(args, "max-sentences"));
  for (int64_t b : d.max_sentences) {
    if (b <= 0) throw UsageError(fmt::format("--max-sentences: {} must be a positive integer", b));
  }
  if (flag_set(args, "max-sentences-valid")) {
    d.max_sentences_valid = positive(args, "max-sentences-valid");
  }
  d.required_batch_size_multiple = positive(args, "required-batch-size-multiple");
  d.train_subset = str(args, "train-subset");
  d.valid_subsets = split_names("valid-subset", str(args, "valid-subset"));
  d.validate_interval = positive(args, "validate-interval");
  d.disable_validation = flag(args, "disable-validation");
  d.curriculum = non_negative(args, "curriculum");
  return d;
}

OptimizationOptions read_optimization(const cxxopts::ParseResult& args) {
  OptimizationOptions p;
  p.max_epoch = non_negative(args, "max-epoch");
  p.max_update = non_negative(args, "max-update");
  p.clip_norm = flag_number(args, "clip-norm");
  if (p.clip_norm < 0) throw UsageError(fmt::format("--clip-norm: {} is negative; 0 turns clipping off", p.clip_norm));
  p.update_freq = parse_int_list("--update-freq", str(args, "update-freq"));
  for (int64_t u : p.update_freq) {
    if (u <= 0) throw UsageError(fmt::format("--update-freq: {} must be a positive integer", u));
  }
  p.lr = parse_double_list("--lr", str(args, "lr"));
  for (double lr : p.lr) {
    if (lr < 0) throw UsageError(fmt::format("--lr: {} is negative", lr));
  }
  p.min_lr = flag_number(args, "min-lr");
  optim::CommonOptimOptions common;
  common.lrs = p.lr;
  common.weight_decay = flag_number(args, "weight-decay");
  common.warmup_updates = non_negative(args, "warmup-updates");
  if (flag_set(args, "force-anneal")) common.force_anneal = positive(args, "force-anneal");
  const FlagValues values = flag_values(args);
  p.optimizer = str(args, "optimizer");
  p.make_optimizer = optim::optimizers().get(p.optimizer).configure(values, common);
  p.lr_scheduler = str(args, "lr_scheduler");
  p.make_lr_scheduler = optim::lr_schedulers().get(p.lr_scheduler).configure(values, common);
  // A malformed value is an error even for a flag of another optimizer or schedule than the one chosen.
  for (const auto& name : optim::optimizers().names()) optim::optimizers().get(name).configure(values, common);
  for (const auto& name : optim::lr_schedulers().names()) optim::lr_schedulers().get(name).configure(values, common);
  return p;
}

DistributedOptions read_distributed(const cxxopts::ParseResult& args) {
  DistributedOptions g;
  WorldOptions& w = g.world;
  if (flag_set(args, "distributed-world-size")) {
    w.world_size = positive(args, "distributed-world-size");
  }
  w.rank = non_negative(args, "distributed-rank");
  w.rank_given = args.count("distributed-rank") > 0;
  if (flag_set(args, "distributed-gpus")) g.gpus = positive(args, "distributed-gpus");
  if (args.count("distributed-backend")) {
    w.backend = str(args, "distributed-backend");
    if (w.backend != "gloo" && w.backend != "nccl") {
      throw UsageError(fmt::format("--distributed-backend: '{}' is not one of gloo, nccl", w.backend));
    }
  }
  if (args.count("distributed-init-method")) w.init_method = str(args, "distributed-init-method");
  w.device_id = non_negative(args, "device-id");
  w.cpu = flag(args, "cpu");
  w.timeout = std::chrono::seconds(positive(args, "distributed-timeout"));
  w.rendezvous_timeout = args.count("rendezvous-timeout") ? std::chrono::seconds(positive(args, "rendezvous-timeout"))
                                                          : std::chrono::milliseconds(w.timeout);
  w.checkpoint_timeout = std::chrono::seconds(positive(args, "checkpoint-timeout"));
  w.debug_collectives = flag(args, "debug-collectives");
  g.no_spawn = flag(args, "distributed-no-spawn");
  g.ddp.bucket_cap_mb = flag_number(args, "bucket-cap-mb");
  g.ddp.find_unused_parameters = flag(args, "find-unused-parameters");
  g.ddp.broadcast_buffers = flag(args, "broadcast-buffers");
  g.fast_stat_sync = flag(args, "fast-stat-sync");
  g.zero_sharding = parse_zero_sharding(str(args, "zero-sharding"));
  if (flag_set(args, "memory-budget")) {
    const double gb = flag_number(args, "memory-budget");
    if (!(gb > 0) || gb > 1e9) {
      throw UsageError(fmt::format("--memory-budget: {} must be a positive number of GB (2^30 bytes)", gb));
    }
    g.memory_budget_bytes = static_cast<int64_t>(gb * static_cast<double>(int64_t{1} << 30));
  }
  g.ddp.comm_hook = parse_comm_hook(str(args, "ddp-comm-hook"));
  g.ddp.powersgd.rank = positive(args, "powersgd-rank");
  g.ddp.powersgd.start_update = non_negative(args, "powersgd-start-update");
  g.ddp.shared_memory = parse_shared_memory_reduce(str(args, "shared-memory-reduce"));
  check_ddp_options(g.ddp);
  g.log_all_ranks = flag(args, "log-all-ranks");
  return g;
}

AutoBalanceOptions read_balance(const cxxopts::ParseResult& args) {
  AutoBalanceOptions b;
  b.auto_balance = flag(args, "auto-balance");
  b.interval = positive(args, "balance-interval");
  b.threshold = flag_number(args, "balance-threshold");
  b.threshold_given = args.count("balance-threshold") > 0;
  if (b.threshold < 0 || b.threshold >= 1) {
    throw UsageError(fmt::format("--balance-threshold: {} must be at least 0 and below 1 (a share of the step time)",
                                 b.threshold));
  }
  if (flag_set(args, "balance-cap")) {
    b.caps = parse_int_list("--balance-cap", str(args, "balance-cap"));
    for (int64_t c : b.caps) {
      if (c <= 0) throw UsageError(fmt::format("--balance-cap: {} must be a positive number of samples", c));
    }
  }
  return b;
}

ObserveOptions read_observe(const cxxopts::ParseResult& args) {
  ObserveOptions f;
  if (args.count("trace-dir")) {
    f.trace_dir = str(args, "trace-dir");
    if (f.trace_dir->empty()) throw UsageError("--trace-dir: empty path");
  }
  TraceOptions window;
  parse_trace_window(str(args, "trace-updates"), window);  // throws naming the flag
  f.trace_first = window.first_update;
  f.trace_last = window.last_update;
  f.trace_ops = flag(args, "trace-ops");
  if (f.trace_ops && !f.trace_dir) throw UsageError("--trace-ops: needs --trace-dir, where the op-level trace goes");
  if (args.count("step-profile")) {
    const std::string text = str(args, "step-profile");
    const size_t comma = text.find(',');
    if (comma == std::string::npos) {
      throw UsageError(fmt::format("--step-profile: '{}' is not WARMUP,TIMED (e.g. 20,100)", text));
    }
    f.step_profile_warmup = parse_int("--step-profile WARMUP", text.substr(0, comma));
    f.step_profile_timed = parse_int("--step-profile TIMED", text.substr(comma + 1));
    if (f.step_profile_warmup < 1 || f.step_profile_timed < 1) {
      throw UsageError(fmt::format("--step-profile: {} needs WARMUP >= 1 and TIMED >= 1 updates", text));
    }
  }
  if (args.count("tensorboard-logdir")) {
    f.tensorboard_logdir = str(args, "tensorboard-logdir");
    if (f.tensorboard_logdir->empty()) throw UsageError("--tensorboard-logdir: empty path");
  }
  if (args.count("json-log")) {
    f.json_log = str(args, "json-log");
    if (f.json_log->empty()) throw UsageError("--json-log: empty path");
  }
  return f;
}

CheckpointOptions read_checkpoint(const cxxopts::ParseResult& args) {
  CheckpointOptions k;
  k.save.save_dir = str(args, "save-dir");
  k.save.no_save = flag(args, "no-save");
  k.save.save_interval = positive(args, "save-interval");
  k.save.save_interval_updates = flag_integer(args, "save-interval-updates");
  if (k.save.save_interval_updates < 0) throw UsageError("--save-interval-updates must be >= 0 (0: off)");
  k.save.keep_interval_updates = flag_integer(args, "keep-interval-updates");
  k.save.keep_last_epochs = flag_integer(args, "keep-last-epochs");
  for (const char* name : {"keep-interval-updates", "keep-last-epochs"}) {
    if (flag_integer(args, name) < -1 || flag_integer(args, name) == 0) {
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
  if (k.save.save_dir.empty()) throw UsageError("--save-dir: empty path");
  return k;
}

}  // namespace

TrainOptions read_train_options(const cxxopts::ParseResult& args) {
  TrainOptions o;
  try {
    o.common = read_common(args);
    o.mixed_precision = read_precision(args);
    o.dataset = read_dataset(args);
    o.optimization = read_optimization(args);
    o.distributed = read_distributed(args);
    o.balance = read_balance(args);
    o.observe = read_observe(args);
    o.checkpoint = read_checkpoint(args);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see --help)", e.what()));
  }
  return o;
}

}  // namespace hetseq::cli
