#pragma once
/// The command line of hetseq-train: flags spelled and grouped as HetSeq spells and groups them, read
/// into the session's typed option structs (hetseq/session/session_options.h). Only the drivers read
/// the command line; tasks, optimizers and schedules get FlagValues.

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
/// "true" or "false". What tasks, optimizers and schedules read their flags from.
FlagValues flag_values(const cxxopts::ParseResult& args);

/// The flag groups of hetseq-train, each with the defaults of `task` (see task_defaults); hetseq-eval
/// reuses the common and precision groups.
void add_common_flags(cxxopts::Options& parser, const std::optional<std::string>& task);
void add_precision_flags(cxxopts::Options& parser, const std::optional<std::string>& task);
void add_dataset_flags(cxxopts::Options& parser, const std::optional<std::string>& task);
void add_optimization_flags(cxxopts::Options& parser, const std::optional<std::string>& task);
void add_distributed_flags(cxxopts::Options& parser, const std::optional<std::string>& task);
void add_balance_flags(cxxopts::Options& parser, const std::optional<std::string>& task);
void add_checkpoint_flags(cxxopts::Options& parser, const std::optional<std::string>& task);
void add_observe_flags(cxxopts::Options& parser, const std::optional<std::string>& task);

/// `argv` with HetSeq's second spellings (--batch-size, --lr-scheduler, --local_rank, ...) replaced
/// by the primary ones, as the parser and the launcher see them.
std::vector<std::string> resolve_aliases(int argc, const char* const argv[]);

/// Parses `argv` with `parser`. Throws hetseq::UsageError on an unknown or malformed flag.
cxxopts::ParseResult parse_command_line(cxxopts::Options& parser, int argc, const char* const argv[]);

/// Every flag of `parser` that is not per-rank (per_rank_flags), task flags included, with its value
/// as text, keyed `--name`: what the ranks compare at start. See Note [Compared flags].
std::map<std::string, std::string> compared_flags(const cxxopts::Options& parser, const cxxopts::ParseResult& args);

/// Reads the common flags (task, seed, device, logging) and the precision flags.
CommonOptions read_common(const cxxopts::ParseResult& args);
MixedPrecisionOptions read_precision(const cxxopts::ParseResult& args);

/// Reads and checks the general flags. Throws hetseq::UsageError naming the flag on a malformed
/// value or an invalid combination.
TrainOptions read_train_options(const cxxopts::ParseResult& args);

/// Splits a comma-separated list of split names; throws hetseq::UsageError naming `--flag_name` on an
/// empty name.
std::vector<std::string> split_names(const std::string& flag_name, const std::string& text);

}  // namespace hetseq::cli
