#pragma once
/// The flags of DatasetOptions (batches and data splits), declared beside the struct: their defaults are
/// the struct's. hetseq-train shows them in "Dataset and data loading"; hetseq-eval reuses three of them.

#include "hetseq/core/flag_set.h"
#include "hetseq/session/session_options.h"

namespace hetseq {

/// Declares --num-workers, --max-sentences, --max-sentences-valid, --required-batch-size-multiple,
/// --train-subset, --valid-subset, --validate-interval, --disable-validation and --curriculum in `flags`,
/// with `defaults`' values as their defaults (--max-sentences has none unless `defaults` gives one).
void declare_dataset_flags(FlagSet& flags, const DatasetOptions& defaults = {});

/// Reads and checks those flags; --max-sentences is required. Throws hetseq::UsageError naming the flag.
DatasetOptions read_dataset_options(const FlagValues& values);

/// The readers of single flags of the group, for a program that declares only some of them (hetseq-eval):
/// --num-workers, --max-sentences (a list of positive sizes, required) and --valid-subset (split names).
int64_t read_num_workers(const FlagValues& values);
std::vector<int64_t> read_max_sentences(const FlagValues& values);
std::vector<std::string> read_valid_subsets(const FlagValues& values);

/// Splits a comma-separated list of split names; throws hetseq::UsageError naming `--flag_name` on an
/// empty name.
std::vector<std::string> split_names(const std::string& flag_name, const std::string& text);

}  // namespace hetseq
