#include "hetseq/cli/train_command.h"

#include <cstring>
#include <iostream>

#include "hetseq/cli/device_notice.h"
#include "hetseq/cli/spawn.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/session/train_session.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/stop_request.h"
#include "hetseq/world/job_secret.h"
#include "hetseq/world/lost_peer.h"
#include "hetseq/world/process_group.h"
#include "hetseq/world/world.h"

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
  load_user_dirs(argc, argv);
  cxxopts::Options parser = make_train_parser(find_task_flag(argc, argv));
  const cxxopts::ParseResult args = parse_command_line(parser, argc, argv);
  if (args.count("help")) {
    print_help(parser);
    return 0;
  }
  if (args.count("make-secret")) {
    const std::string path = args["make-secret"].as<std::string>();
    JobSecret::make(path);
    std::cout << "hetseq-train: wrote a new job secret to " << path
              << " (mode 0600): give every node of the job --distributed-secret-file " << path << std::endl;
    return 0;
  }
  const TrainOptions o = read_train_options(args);
  const SpawnPlan plan = plan_for_this_process(o);
  if (plan.workers > 1) return spawn_workers(o, argc, argv, plan);

  stop_request::die_with_launcher();
  World world(o.distributed.world);
  log::set_rank(world.rank());
  log::enable_all_ranks(o.distributed.log_all_ranks);
  apply_to_process(o.common);
  TrainSession session(o, compared_flags(parser, args), flag_values(args), world);
  // Once the run is built, so that an error in building it stays the one line on stderr.
  if (const auto warning = cpu_fallback_warning_here(o.common.cpu)) log::warn("{}", *warning);
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

// See the README's table. The backend may hand on a peer's failure (a PeerError raised in a
// communication hook) wrapped in its own error type, hence peer_failure_seen(), and a collective that
// no hetseq code waited for fails with the backend's own error, hence is_lost_peer() (Note [Lost peers
// in collectives]).
int exit_code_for(const std::exception& e) {
  if (dynamic_cast<const UsageError*>(&e)) return kExitUsage;
  if (dynamic_cast<const InternalError*>(&e)) return kExitInternal;
  if (dynamic_cast<const PeerError*>(&e) || peer_failure_seen() || is_lost_peer(e)) return kExitPeerLost;
  return dynamic_cast<const InputError*>(&e) ? kExitInput : kExitInternal;
}

// The one line for `e`: its message, and for the backend's own report of a lost peer what it means.
std::string error_line(const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = torch_error ? torch_error->what_without_backtrace() : e.what();
  if (dynamic_cast<const PeerError*>(&e) || peer_failure_seen() || !is_lost_peer(e)) return what;
  return fmt::format("a collective lost a peer: {} (a rank died, its connection broke, or it fell behind past "
                     "--distributed-timeout; restart the run, it resumes from checkpoint_last.pt)",
                     what);
}

}  // namespace

int run_guarded(int (*body)(int, const char* const*), const char* program, int argc, const char* const argv[]) {
  // The exit codes are a table in the README ("On a cluster"): a supervisor restarts on kExitPeerLost
  // and kExitStopped, and not on a usage or input error.
  flight_recorder_off_by_default();  // before any thread: Note [Flight recorder off]
  int code = kExitInternal;
  try {
    return body(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << error_line(e) << std::endl;
    code = exit_code_for(e);
  }
  World::abandon(code);  // a joined worker leaves at once: Gloo's teardown can spin for minutes
  return code;
}

int train_main(int argc, const char* const argv[]) { return run_guarded(train, "hetseq-train", argc, argv); }

namespace {

int with_pointers(int (*main)(int, const char* const*), const std::vector<std::string>& argv) {
  std::vector<const char*> pointers;
  for (const auto& a : argv) pointers.push_back(a.c_str());
  pointers.push_back(nullptr);
  return main(static_cast<int>(argv.size()), pointers.data());
}

}  // namespace

int train_main(const std::vector<std::string>& argv) { return with_pointers(train_main, argv); }

int eval_main(const std::vector<std::string>& argv) { return with_pointers(eval_main, argv); }

}  // namespace hetseq::cli
