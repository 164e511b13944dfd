#include "hetseq/cli/train_command.h"

#include <cstring>
#include <iostream>

#include "hetseq/cli/spawn.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/cli/train_session.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/stop_request.h"
#include "hetseq/distributed/rendezvous.h"
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
  // torchrun starts one process per worker itself (Note [Joining a world]).
  const bool one_worker = o.distributed.no_spawn || launched_by_torchrun(process_environment());
  const int64_t workers = one_worker ? 1 : local_workers(o);
  if (workers > 1) return spawn_workers(o, argc, argv, workers);

  stop_request::die_with_launcher();
  World world(o.distributed.world);
  log::set_rank(world.rank());
  log::enable_all_ranks(o.distributed.log_all_ranks);
  if (o.common.intra_op_threads > 0) torch::set_num_threads(static_cast<int>(o.common.intra_op_threads));
  TrainSession session(o, parser, args, world);
  stop_request::install();  // from here on a signal is a clean stop: Note [Clean stops]
  session.run();
  const int code = session.stopped() ? kExitStopped : kExitDone;
  if (session.stopped()) {
    log::info("[train] stopped by {}; run the same command again to continue from checkpoint_last.pt (exit code {})",
              stop_request::signal_name(stop_request::signal_number()), code);
  }
  world.leave(code);
  return code;
}

}  // namespace

int run_guarded(int (*body)(int, const char* const*), const char* program, int argc, const char* const argv[]) {
  // The exit codes are a table in the README ("On a cluster"): a supervisor restarts on kExitPeerLost
  // and kExitStopped, and not on a usage or input error.
  int code = kExitInternal;
  try {
    return body(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
    code = kExitUsage;
  } catch (const PeerError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
    code = kExitPeerLost;
  } catch (const InputError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
    code = peer_failure_seen() ? kExitPeerLost : kExitInput;
  } catch (const c10::DistError& e) {
    std::cerr << program << ": error: " << e.what_without_backtrace() << std::endl;
    code = kExitPeerLost;
  } catch (const c10::Error& e) {
    // The backend hands on a peer's failure (raised in a communication hook) wrapped in its own error.
    std::cerr << program << ": error: " << e.what_without_backtrace() << std::endl;
    code = peer_failure_seen() ? kExitPeerLost : kExitInternal;
  } catch (const InternalError& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << e.what() << std::endl;
    code = peer_failure_seen() ? kExitPeerLost : kExitInternal;
  }
  World::abandon(code);  // a joined worker leaves at once: Gloo's teardown can spin for minutes
  return code;
}

int train_main(int argc, const char* const argv[]) { return run_guarded(train, "hetseq-train", argc, argv); }

}  // namespace hetseq::cli
