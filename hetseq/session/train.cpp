#include "hetseq/session/train.h"

#include <cstdlib>
#include <set>
#include <utility>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/stop_request.h"
#include "hetseq/world/world.h"
#include "hetseq/session/train_session.h"
#include "hetseq/task/task_registry.h"
#include "hetseq/train/training_observer.h"

namespace hetseq {
namespace {

// The defaults of the flags that `declare` declares, as text (switches and flags without one: unset).
std::map<std::string, std::string> default_texts(const std::function<void(FlagSet&)>& declare) {
  std::map<std::string, std::string> texts;
  if (!declare) return texts;
  FlagSet set("defaults");
  declare(set);
  for (const FlagSpec& f : set.flags()) {
    if (!f.is_switch && f.default_text) texts[f.name] = *f.default_text;
  }
  return texts;
}

// An empty optimizer or schedule factory, built from its name with --lr and that one's default flags.
void complete_optimization(OptimizationOptions& p) {
  optim::CommonOptimOptions common;
  common.lrs = p.lr;
  if (!p.make_optimizer) {
    const optim::OptimizerSpec& spec = optim::optimizers().get(p.optimizer);
    p.make_optimizer = spec.configure(FlagValues(default_texts(spec.flags)), common);
  }
  if (!p.make_lr_scheduler) {
    const optim::LrSchedulerSpec& spec = optim::lr_schedulers().get(p.lr_scheduler);
    p.make_lr_scheduler = spec.configure(FlagValues(default_texts(spec.flags)), common);
  }
}

// What every rank must agree on, named as hetseq-train's flags (Note [Compared flags]): the options that
// decide the model every rank trains, and the task's flags but `data` (a path, which may differ by mount
// point; the session compares the splits' sizes).
std::map<std::string, std::string> compared_options(const TrainOptions& o, const FlagValues& task_flags) {
  const OptimizationOptions& p = o.optimization;
  std::map<std::string, std::string> compared{
      {"--task", o.common.task},
      {"--seed", std::to_string(o.common.seed)},
      {"--optimizer", p.optimizer},
      {"--lr_scheduler", p.lr_scheduler},
      {"--lr", fmt::format("{}", fmt::join(p.lr, ","))},
      {"--max-epoch", std::to_string(p.max_epoch)},
      {"--max-update", std::to_string(p.max_update)},
      {"--clip-norm", fmt::format("{}", p.clip_norm)},
      {"--train-subset", o.dataset.train_subset},
      {"--valid-subset", fmt::format("{}", fmt::join(o.dataset.valid_subsets, ","))},
      {"--precision (from --fp16 and --bf16)", to_string(o.mixed_precision.precision)},
      {"--zero-sharding", to_string(o.distributed.zero_sharding)},
  };
  for (const auto& [name, text] : task_flags.texts()) {
    if (name != "data") compared["--" + name] = text;
  }
  return compared;
}

// The values a registered task is built from: its flags' defaults, its spec's defaults, `given`; and
// --train-subset as `o` has it. A name the task does not declare (but `data`) is a UsageError.
FlagValues task_flag_values(const TrainOptions& o, const TaskSpec& spec, const std::map<std::string, std::string>& given) {
  std::map<std::string, std::string> texts = default_texts(spec.flags);
  std::set<std::string> known{"data"};
  for (const auto& [name, text] : texts) known.insert(name);
  if (spec.flags) {
    FlagSet set(spec.group());
    spec.flags(set);
    for (const FlagSpec& f : set.flags()) known.insert(f.name);
  }
  for (const auto& [name, text] : spec.defaults) {
    if (known.count(name)) texts[name] = text;
  }
  for (const auto& [name, text] : given) {
    if (!known.count(name)) {
      throw UsageError(fmt::format("train(): '{}' is not a flag of the task '{}' (its flags: {})", name, spec.name,
                                   fmt::join(known, ", ")));
    }
    texts[name] = text;
  }
  texts["train-subset"] = o.dataset.train_subset;
  return FlagValues(std::move(texts));
}

// Keeps what the result reports: the last epoch's training statistics and the first valid subset's
// last validation.
class ResultObserver final : public TrainingObserver {
 public:
  explicit ResultObserver(std::string first_valid_subset) : subset_(std::move(first_valid_subset)) {}
  void on_epoch_end(int64_t /*epoch*/, const std::vector<Stat>& stats) override { train_ = as_map(stats); }
  void on_validation(int64_t /*epoch*/, const std::string& split, const std::vector<Stat>& stats) override {
    if (split == subset_) valid_ = as_map(stats);
  }
  std::map<std::string, double> train_, valid_;

 private:
  static std::map<std::string, double> as_map(const std::vector<Stat>& stats) {
    std::map<std::string, double> out;
    for (const Stat& s : stats) {
      if (s.list.empty() && s.reals.empty()) out[s.name] = s.value;
    }
    return out;
  }
  std::string subset_;
};

}  // namespace

// Note [Deterministic GPU kernels]
// On the CPU, LibTorch's kernels give the same bits for the same inputs and thread count, which is what
// bit-exact resume rests on. On a GPU two things break that, seen on an H100 with MNISTNet (two
// uninterrupted runs of 7 updates ended with different conv weights):
// - cuDNN picks a convolution algorithm by heuristics (or by timing, with benchmark mode), and several of
//   the backward algorithms sum with atomics in whatever order the blocks finish;
// - cuBLAS may split a product over a workspace whose size, and so whose summation order, depends on what
//   else the stream is doing, unless CUBLAS_WORKSPACE_CONFIG fixes it (:4096:8, NVIDIA's documented value).
// --deterministic asks cuDNN for deterministic algorithms only, turns its benchmark mode off and fixes the
// cuBLAS workspace before cuBLAS starts (an explicit CUBLAS_WORKSPACE_CONFIG in the environment is kept).
// It does not make LibTorch refuse its other nondeterministic kernels (scatter-add and index-add with
// atomics): MNIST and BERT training use none whose result depends on the order (max-pooling's backward
// adds once per input element for non-overlapping windows). Costs some speed; off by default, as in
// PyTorch.
void apply_to_process(const CommonOptions& common) {
  if (common.intra_op_threads > 0) torch::set_num_threads(static_cast<int>(common.intra_op_threads));
  if (common.deterministic) {
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setBenchmarkCuDNN(false);
    at::globalContext().setDeterministicCuDNN(true);
  }
}

namespace {

TrainResult run_session(const TrainOptions& options, const std::function<TrainResult(const TrainOptions&, World&)>& body) {
  if (options.common.task.empty()) {
    throw UsageError("TrainOptions::common.task is empty; name the task (a registered TaskSpec, or the name that "
                     "logs and checkpoints give a task of one's own)");
  }
  // The checks that hetseq-train's flag readers run, once, for options that come without a command line.
  options.optimization.validate();
  options.distributed.ddp.validate();
  options.distributed.validate();
  TrainOptions o = options;
  complete_optimization(o.optimization);
  World world(o.distributed.world);
  log::set_rank(world.rank());
  log::enable_all_ranks(o.distributed.log_all_ranks);
  apply_to_process(o.common);
  TrainResult result = body(o, world);
  world.finish();
  return result;
}

TrainResult train_with(const TrainOptions& o, std::map<std::string, std::string> compared, const TaskFactory& make_task,
                       World& world) {
  TrainSession session(o, std::move(compared), make_task, world);
  const std::string first_valid = o.dataset.valid_subsets.empty() ? "" : o.dataset.valid_subsets.front();
  auto observer = std::make_shared<ResultObserver>(first_valid);
  session.add_observer(observer);
  stop_request::install();  // from here on a signal is a clean stop: Note [Clean stops]
  TrainResult result;
  result.last_epoch = session.run();
  result.num_updates = session.num_updates();
  result.stopped = session.stopped();
  result.train = std::move(observer->train_);
  result.valid = std::move(observer->valid_);
  return result;
}

}  // namespace

TrainResult train(const TrainOptions& options, const std::map<std::string, std::string>& task_flags) {
  const TaskSpec& spec = TaskRegistry::global().get(options.common.task);  // throws on an unknown task
  const FlagValues flags = task_flag_values(options, spec, task_flags);
  return run_session(options, [&](const TrainOptions& o, World& world) {
    auto make_task = [&](const TaskContext& context) { return spec.create(flags, context); };
    return train_with(o, compared_options(o, flags), make_task, world);
  });
}

TrainResult train(const TrainOptions& options, const TaskFactory& make_task) {
  if (!make_task) throw UsageError("train(): the task factory is empty");
  return run_session(options, [&](const TrainOptions& o, World& world) {
    return train_with(o, compared_options(o, FlagValues()), make_task, world);
  });
}

}  // namespace hetseq
