#include "hetseq/session/common_flags.h"

#include "hetseq/core/error.h"
#include "hetseq/core/flag_text.h"
#include "hetseq/task/task_registry.h"

namespace hetseq {

void declare_common_flags(FlagSet& flags, const CommonOptions& d) {
  if (d.task.empty()) {
    flags.add_optional("task", "the task to train (see Tasks above)");
  } else {
    flags.add("task", "the task to train (see Tasks above)", d.task);
  }
  flags.add("seed", "pseudo random number generator seed", flag_text(d.seed))
      .add_switch("cpu", "use the CPU even when CUDA is available", d.cpu).per_rank()
      .add_switch("no-progress-bar", "disable the progress bar", d.no_progress_bar).per_rank()
      .add("log-interval", "log statistics every N updates", flag_text(d.log_interval)).per_rank()
      .add("log-format", "how statistics are printed: none, simple, json", to_string(d.log_format)).per_rank()
      .add("intra-op-threads", "LibTorch intra-op threads of this process (0: LibTorch's default)",
           flag_text(d.intra_op_threads)).per_rank()
      .add_switch("deterministic", "on a GPU, deterministic cuDNN and cuBLAS kernels, so that a run and its resume "
                  "are bit-equal there (slower)", d.deterministic)
      .add_switch("cuda-graph", "on a GPU, a world of one: capture an update's forward, backward and clipping into a "
                  "CUDA graph and replay it, for batches of one shape (the task pads them to it); where a run cannot, "
                  "one line says why and it trains uncaptured", d.cuda_graph);
}

CommonOptions read_common_options(const FlagValues& values) {
  CommonOptions c;
  if (!values.has("task")) {
    throw UsageError(fmt::format("--task is required; known tasks: {}",
                                 fmt::join(TaskRegistry::global().names(), ", ")));
  }
  c.task = values.text("task");
  TaskRegistry::global().get(c.task);  // throws on an unknown task
  const int64_t seed = values.integer("seed");
  if (seed < 0) throw UsageError(fmt::format("--seed: {} is negative", seed));
  c.seed = static_cast<uint64_t>(seed);
  c.cpu = values.flag("cpu");
  c.no_progress_bar = values.flag("no-progress-bar");
  c.log_interval = values.positive("log-interval");
  c.log_format = parse_log_format(values.text("log-format"));
  c.intra_op_threads = values.non_negative("intra-op-threads");
  c.deterministic = values.flag("deterministic");
  c.cuda_graph = values.flag("cuda-graph");
  return c;
}

}  // namespace hetseq
