#pragma once
/// The command line of hetseq-train: flags spelled and grouped as HetSeq spells and groups them, read
/// into the session's typed option structs (hetseq/session/session_options.h). The flags are declared
/// and read beside those structs (hetseq/session/*_flags.h and the components' own *_flags.h); this
/// file only collects them into one parser. Only the drivers read the command line; tasks, optimizers
/// and schedules get FlagValues.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "hetseq/cli/flags.h"
#include "hetseq/core/flag_set.h"
#include "hetseq/session/session_options.h"

namespace hetseq::cli {

/// The value of --task in `argv`, if any (looked up before the full parse, so that the task's flags
/// and defaults can be added).
std::optional<std::string> find_task_flag(int argc, const char* const argv[]);

/// Loads every `--user-dir PATH` of `argv` (see load_user_dir), before the parser is built, so that the
/// tasks they register have their flags and defaults; then reports a failed in-tree registration.
void load_user_dirs(int argc, const char* const argv[]);

/// The defaults that the task named by `task` sets for general flags (empty for no or an unknown task).
std::map<std::string, std::string> task_defaults(const std::optional<std::string>& task);

/// The driver's own flags, in the first help group: --help (-h), --user-dir and --data (the task's path,
/// read by the task).
FlagSet driver_flags();

/// Every general flag of hetseq-train, collected from the components that declare them, each set a help
/// group in --help's order: the driver's and CommonOptions' (first group), then MixedPrecisionOptions',
/// DatasetOptions', OptimizationOptions' (with the registered optimizers' and schedules' own flags),
/// DistributedOptions', AutoBalanceOptions', CheckpointOptions' and ObserveOptions'. Each default is the
/// options struct's: see Note [One declaration per flag].
std::vector<FlagSet> general_flags();

/// Builds the parser with every general flag and every registered task's flags; when `task` names a
/// registered task, its defaults replace the general ones.
cxxopts::Options make_train_parser(const std::optional<std::string>& task);

/// Adds the flags of `flags` to `parser` in their group, each with the default the --task sets for it
/// (`default_of`, may be empty), else its own; skips (and records) names in `declared` when given.
void add_flag_set(cxxopts::Options& parser, const FlagSet& flags, const DefaultOf& default_of,
                  std::set<std::string>* declared = nullptr);

/// Adds every registered task's own flags (TaskSpec::flags), each task's under its group. A flag name that
/// several tasks declare is declared once, by `task` (the --task given) when it declares it: Note [A task's
/// flags are its own].
void add_task_flags(cxxopts::Options& parser, const std::optional<std::string>& task = std::nullopt);

/// Every flag with a value, as text: given (the last time it appears), else its default; switches as
/// "true" or "false"; with the names given on the command line (FlagValues::given). What the general
/// flags' readers, tasks, optimizers and schedules read their flags from.
FlagValues flag_values(const cxxopts::ParseResult& args);

/// `argv` with HetSeq's second spellings (--batch-size, --lr-scheduler, --local_rank, ...) replaced
/// by the primary ones, as the parser and the launcher see them.
std::vector<std::string> resolve_aliases(int argc, const char* const argv[]);

/// Parses `argv` with `parser`. Throws hetseq::UsageError on an unknown or malformed flag.
cxxopts::ParseResult parse_command_line(cxxopts::Options& parser, int argc, const char* const argv[]);

/// Every flag of `parser` that is not per-rank (per_rank_flags), the running task's flags included and
/// other tasks' not, with its value as text, keyed `--name`: what the ranks compare at start. See Note
/// [Compared flags].
std::map<std::string, std::string> compared_flags(const cxxopts::Options& parser, const cxxopts::ParseResult& args);

/// Reads and checks the general flags, each group by the reader beside its options struct. Throws
/// hetseq::UsageError naming the flag on a malformed value or an invalid combination.
TrainOptions read_train_options(const FlagValues& values);
TrainOptions read_train_options(const cxxopts::ParseResult& args);

}  // namespace hetseq::cli
