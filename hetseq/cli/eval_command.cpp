#include <iostream>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/cli/train_command.h"
#include "hetseq/cli/flags.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/core/error.h"
#include "hetseq/world/world.h"
#include "hetseq/session/common_flags.h"
#include "hetseq/session/dataset_flags.h"
#include "hetseq/session/precision_flags.h"
#include "hetseq/task/task_registry.h"
#include "hetseq/train/validator.h"

namespace hetseq::cli {
namespace {

// hetseq-eval's flags: hetseq-train's first group and its precision flags, and in "Evaluation" the model
// file and three of the dataset flags, declared where hetseq-train's are (default batch: 256 samples).
cxxopts::Options make_eval_parser(const std::optional<std::string>& task) {
  const DefaultOf task_default = defaults_from(task_defaults(task));
  cxxopts::Options parser("hetseq-eval", "Evaluates a saved hetseq model on data splits.");
  FlagSet common = driver_flags();
  declare_common_flags(common);
  FlagSet precision("Mixed precision");
  declare_precision_flags(precision);
  DatasetOptions eval_batches;
  eval_batches.max_sentences = {256};
  FlagSet dataset("Dataset and data loading");
  declare_dataset_flags(dataset, eval_batches);
  FlagSet evaluation = dataset.subset("Evaluation", {"num-workers", "max-sentences", "valid-subset"});
  evaluation.add("path", "the model file (checkpoint) to evaluate", "checkpoints/checkpoint_last.pt");
  for (const FlagSet& flags : {common, precision, evaluation}) add_flag_set(parser, flags, task_default);
  add_task_flags(parser, task);
  return parser;
}

int evaluate(int argc, const char* const argv[]) {
  load_user_dirs(argc, argv);
  cxxopts::Options parser = make_eval_parser(find_task_flag(argc, argv));
  const cxxopts::ParseResult args = parse_command_line(parser, argc, argv);
  if (args.count("help")) {
    std::cout << parser.help() << std::endl;
    return 0;
  }
  const FlagValues values = flag_values(args);
  const CommonOptions common = read_common_options(values);
  const MixedPrecisionOptions precision = read_precision_options(values);
  apply_to_process(common);
  const std::vector<int64_t> batch_sizes = read_max_sentences(values);
  if (batch_sizes.size() != 1) {
    throw UsageError(fmt::format("--max-sentences: {} values given; hetseq-eval runs one worker, give one",
                                 batch_sizes.size()));
  }
  const int64_t batch_size = batch_sizes.front();
  ValidatorOptions vopts;
  vopts.num_workers = read_num_workers(values);
  vopts.precision = precision.precision;
  WorldOptions single;
  single.cpu = common.cpu;
  const World world(single);
  vopts.device = world.device();

  TaskContext context;
  context.device = vopts.device;
  context.seed = common.seed;
  std::unique_ptr<Task> task = TaskRegistry::global().get(common.task).create(values, context);
  std::shared_ptr<torch::nn::Module> model = task->build_model();
  load_model(*model, values.text("path"));
  model->to(vopts.device);
  Validator validator(*task, nullptr, DataPlan::single(batch_size, 1), vopts);
  ProgressLogger progress(common.log_format, false, 1);
  for (const auto& split : read_valid_subsets(values)) {
    progress.log(0, "valid", validator.stats(validator.run(task->load_dataset(split), *model), 0), split);
  }
  return 0;
}

}  // namespace

int eval_main(int argc, const char* const argv[]) { return run_guarded(evaluate, "hetseq-eval", argc, argv); }

}  // namespace hetseq::cli
