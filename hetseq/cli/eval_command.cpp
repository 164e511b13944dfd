#include <iostream>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/cli/train_command.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/core/error.h"
#include "hetseq/cli/flags.h"
#include "hetseq/core/parse.h"
#include "hetseq/world/world.h"
#include "hetseq/task/task_registry.h"
#include "hetseq/train/validator.h"

namespace hetseq::cli {
namespace {

cxxopts::Options make_eval_parser(const std::optional<std::string>& task) {
  const DefaultOf d = defaults_from(task_defaults(task));
  cxxopts::Options parser("hetseq-eval", "Evaluates a saved hetseq model on data splits.");
  add_common_flags(parser, task);
  add_precision_flags(parser, task);
  parser.add_options("Evaluation")
      ("path", "the model file (checkpoint) to evaluate", text_flag(d, "path", "checkpoints/checkpoint_last.pt"))
      ("valid-subset", "comma-separated splits to evaluate", text_flag(d, "valid-subset", "valid"))
      ("max-sentences", "samples per batch", text_flag(d, "max-sentences", "256"))
      ("num-workers", "background threads that build batches", text_flag(d, "num-workers", "1"));
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
  const CommonOptions common = read_common(args);
  const MixedPrecisionOptions precision = read_precision(args);
  apply_to_process(common);
  const int64_t batch_size = flag_integer(args, "max-sentences");
  if (batch_size <= 0) throw UsageError("--max-sentences must be positive");
  ValidatorOptions vopts;
  vopts.num_workers = flag_integer(args, "num-workers");
  vopts.precision = precision.precision;
  WorldOptions single;
  single.cpu = common.cpu;
  const World world(single);
  vopts.device = world.device();

  TaskContext context;
  context.device = vopts.device;
  context.seed = common.seed;
  std::unique_ptr<Task> task = TaskRegistry::global().get(common.task).create(flag_values(args), context);
  std::shared_ptr<torch::nn::Module> model = task->build_model();
  load_model(*model, args["path"].as<std::string>());
  model->to(vopts.device);
  Validator validator(*task, nullptr, DataPlan::single(batch_size, 1), vopts);
  ProgressLogger progress(common.log_format, false, 1);
  for (const auto& split : split_names("valid-subset", args["valid-subset"].as<std::string>())) {
    progress.log(0, "valid", validator.stats(validator.run(task->load_dataset(split), *model), 0), split);
  }
  return 0;
}

}  // namespace

int eval_main(int argc, const char* const argv[]) { return run_guarded(evaluate, "hetseq-eval", argc, argv); }

}  // namespace hetseq::cli
