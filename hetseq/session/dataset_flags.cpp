#include "hetseq/session/dataset_flags.h"

#include "hetseq/core/error.h"
#include "hetseq/core/flag_text.h"
#include "hetseq/core/parse.h"

namespace hetseq {

void declare_dataset_flags(FlagSet& flags, const DatasetOptions& d) {
  flags.add("num-workers", "background threads that build batches (0: build in the training thread)",
            flag_text(d.num_workers)).per_rank();
  const std::string batch_help = "samples per batch (alias --batch-size); a comma list gives one per local worker";
  if (d.max_sentences.empty()) {
    flags.add_optional("max-sentences", batch_help).per_rank();
  } else {
    flags.add("max-sentences", batch_help, flag_text(d.max_sentences)).per_rank();
  }
  const std::string valid_help = "samples per validation batch (default: --max-sentences)";
  if (d.max_sentences_valid) {
    flags.add("max-sentences-valid", valid_help, flag_text(*d.max_sentences_valid)).per_rank();
  } else {
    flags.add_optional("max-sentences-valid", valid_help).per_rank();
  }
  flags.add("required-batch-size-multiple", "round batch sizes down to a multiple of N",
            flag_text(d.required_batch_size_multiple))
      .add("train-subset", "data split to train on", flag_text(d.train_subset))
      .add("valid-subset", "comma-separated data splits to validate on", flag_text(d.valid_subsets))
      .add("validate-interval", "validate every N epochs", flag_text(d.validate_interval))
      .add_switch("disable-validation", "disable validation", d.disable_validation)
      .add("curriculum", "don't shuffle batches for the first N epochs", flag_text(d.curriculum));
}

std::vector<std::string> split_names(const std::string& flag_name, const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) throw UsageError(fmt::format("--{}: '{}' has an empty split name", flag_name, text));
    out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int64_t read_num_workers(const FlagValues& values) { return values.non_negative("num-workers"); }

std::vector<int64_t> read_max_sentences(const FlagValues& values) {
  if (!values.has("max-sentences")) {
    throw UsageError("--max-sentences (or --batch-size) is required: the number of samples per batch");
  }
  std::vector<int64_t> sizes = parse_int_list("--max-sentences", values.text("max-sentences"));
  for (int64_t b : sizes) {
    if (b <= 0) throw UsageError(fmt::format("--max-sentences: {} must be a positive integer", b));
  }
  return sizes;
}

std::vector<std::string> read_valid_subsets(const FlagValues& values) {
  return split_names("valid-subset", values.text("valid-subset"));
}

DatasetOptions read_dataset_options(const FlagValues& values) {
  DatasetOptions d;
  d.num_workers = read_num_workers(values);
  d.max_sentences = read_max_sentences(values);
  if (values.has("max-sentences-valid")) d.max_sentences_valid = values.positive("max-sentences-valid");
  d.required_batch_size_multiple = values.positive("required-batch-size-multiple");
  d.train_subset = values.text("train-subset");
  d.valid_subsets = read_valid_subsets(values);
  d.validate_interval = values.positive("validate-interval");
  d.disable_validation = values.flag("disable-validation");
  d.curriculum = values.non_negative("curriculum");
  return d;
}

}  // namespace hetseq
