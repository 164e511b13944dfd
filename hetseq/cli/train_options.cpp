#include "hetseq/cli/train_options.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "hetseq/cli/flags.h"
#include "hetseq/cli/nearest_flag.h"
#include "hetseq/cli/per_rank_flags.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/optim/registry.h"
#include "hetseq/session/balance_flags.h"
#include "hetseq/session/checkpoint_flags.h"
#include "hetseq/session/common_flags.h"
#include "hetseq/session/dataset_flags.h"
#include "hetseq/session/distributed_flags.h"
#include "hetseq/session/observe_flags.h"
#include "hetseq/session/optimization_flags.h"
#include "hetseq/session/precision_flags.h"
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

// Note [One declaration per flag]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each general flag is declared once, on a FlagSet, by the component whose options struct it fills,
// beside that struct (hetseq/session/common_flags.h for CommonOptions, hetseq/reduce/ddp_flags.h
// for DdpOptions, ...), with the struct's default value as its default (flag_text), and read and checked
// there too. So hetseq-train and a program that fills the structs itself (hetseq::train) start from the
// same defaults, which tests/cli/test_flag_defaults.cpp checks struct by struct. The optimizers and
// schedules declare theirs the same way, from AdamOptions, FixedOptions, ... (hetseq/optim/). This file
// only collects the sets into one cxxopts parser, where a --task's defaults replace the general ones
// (task_defaults), and hands the parsed texts back to the readers as FlagValues. hetseq-eval collects
// the sets it needs the same way.
FlagSet driver_flags() {
  FlagSet flags("");
  flags.add_switch("help", "show this help (with --task T, also T's flags and defaults) and exit").per_rank()
      .short_name("h")
      .add_optional("user-dir", "a task library built outside this tree (lib<task>.so, or a folder of them), loaded "
                    "before --task is looked up; its flags then show with --task NAME --help", "PATH").per_rank()
      .add_optional("data", "path of the task's data").per_rank();
  return flags;
}

std::vector<FlagSet> general_flags() {
  FlagSet common = driver_flags();
  declare_common_flags(common);
  FlagSet precision("Mixed precision");
  declare_precision_flags(precision);
  FlagSet dataset("Dataset and data loading");
  declare_dataset_flags(dataset);
  FlagSet optimization("Optimization"), schedule("Learning rate scheduler");
  declare_optimization_flags(optimization, schedule);
  FlagSet optimizers("Optimizer"), schedules("Learning rate scheduler");
  optim::optimizers().declare_flags(optimizers);
  optim::lr_schedulers().declare_flags(schedules);
  FlagSet distributed("Distributed training");
  declare_distributed_flags(distributed);
  FlagSet balance("Balancing");
  declare_balance_flags(balance);
  FlagSet checkpoint("Checkpointing");
  declare_checkpoint_flags(checkpoint);
  FlagSet observe("Seeing a run");
  declare_observe_flags(observe);
  return {common, precision, dataset, optimization, schedule, optimizers, schedules, distributed, balance,
          checkpoint, observe};
}

cxxopts::Options make_train_parser(const std::optional<std::string>& task) {
  cxxopts::Options parser("hetseq-train",
                          "Synchronous data-parallel training across devices of different speed and memory.\n"
                          "Tasks: " + fmt::format("{}", fmt::join(TaskRegistry::global().names(), ", ")));
  parser.set_width(110);
  const DefaultOf task_default = defaults_from(task_defaults(task));
  for (const FlagSet& flags : general_flags()) add_flag_set(parser, flags, task_default);
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
    const std::string names = f.short_name.empty() ? f.name : f.short_name + "," + f.name;
    if (f.is_switch) {  // a task's default does not turn a switch on: it is given, or its own default
      add(names, f.help, cxxopts::value<bool>()->default_value(f.default_text.value_or("false")));
    } else if (text) {
      add(names, f.help, cxxopts::value<std::string>()->default_value(*text), f.value_name);
    } else {
      add(names, f.help, cxxopts::value<std::string>(), f.value_name);
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
  std::set<std::string> given_names;
  for (const auto& defaulted : args.defaults()) texts[defaulted.key()] = defaulted.value();
  for (const auto& given : args.arguments()) {
    texts[given.key()] = given.value();
    given_names.insert(given.key());
  }
  return FlagValues(std::move(texts), std::move(given_names));
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
  // The flag groups of the tasks that do not run: what they say cannot change this run, and a rank whose
  // program knows another set of tasks (a --user-dir library loaded for another task, another build's
  // tasks) trains the same model.
  const TaskRegistry& tasks = TaskRegistry::global();
  const std::string task = values.text_or("task", "");
  const std::string running = tasks.contains(task) ? tasks.get(task).group() : "";
  std::set<std::string> other_tasks;
  for (const auto& name : tasks.names()) {
    if (tasks.get(name).group() != running) other_tasks.insert(tasks.get(name).group());
  }
  std::map<std::string, std::string> out;
  for (const auto& group : parser.groups()) {
    if (other_tasks.count(group)) continue;
    for (const auto& option : parser.group_help(group).options) {
      const std::string& name = option.l.empty() ? option.s : option.l.front();
      if (per_rank_flags().count(name)) continue;
      out["--" + name] = values.text_or(name, "(not set)");
    }
  }
  return out;
}

TrainOptions read_train_options(const FlagValues& values) {
  TrainOptions o;
  o.common = read_common_options(values);
  o.mixed_precision = read_precision_options(values);
  o.dataset = read_dataset_options(values);
  o.optimization = read_optimization_options(values);
  o.distributed = read_distributed_options(values);
  o.balance = read_balance_options(values);
  o.observe = read_observe_options(values);
  o.checkpoint = read_checkpoint_options(values);
  return o;
}

TrainOptions read_train_options(const cxxopts::ParseResult& args) { return read_train_options(flag_values(args)); }

}  // namespace hetseq::cli
