#include "hetseq/cli/train_command.h"

#include <iostream>

#include "hetseq/cli/spawn.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/cli/train_session.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/distributed/world.h"

namespace hetseq::cli {
namespace {

void print_help(const cxxopts::Options& parser) {
  std::vector<std::string> groups{"", "Dataset and data loading", "Distributed training", "Optimization",
                                  "Optimizer", "Learning rate scheduler", "Checkpointing"};
  for (const auto& g : parser.groups()) {
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  std::cout << parser.help(groups) << std::endl;
}


// Parse, spawn or join, build, run, leave.
int train(int argc, const char* const argv[]) {
  cxxopts::Options parser = make_train_parser(find_task_flag(argc, argv));
  const cxxopts::ParseResult args = parse_command_line(parser, argc, argv);
  if (args.count("help")) {
    print_help(parser);
    return 0;
  }
  const TrainOptions o = read_train_options(args);
  const int64_t workers = o.distributed.no_spawn ? 1 : local_workers(o);
  if (workers > 1) return spawn_workers(o, argc, argv, workers);

  World world(o.distributed.world);
  log::set_rank(world.rank());
  log::enable_all_ranks(o.distributed.log_all_ranks);
  if (o.common.intra_op_threads > 0) torch::set_num_threads(static_cast<int>(o.common.intra_op_threads));
  TrainSession session(o, parser, args, world);
  session.run();
  world.leave(0);
  return 0;
}

}  // namespace

int run_guarded(int (*body)(int, const char* const*), const char* program, int argc, const char* const argv[]) {
  int code = 1;
  try {
    return body(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
    code = 2;
  } catch (const c10::Error& e) {
    std::cerr << program << ": error: " << e.what_without_backtrace() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
  }
  World::abandon(code);  // a joined worker leaves at once: Gloo's teardown can spin for minutes
  return code;
}

int train_main(int argc, const char* const argv[]) { return run_guarded(train, "hetseq-train", argc, argv); }

}  // namespace hetseq::cli
