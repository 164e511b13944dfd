// Fuzz harness: the command line of hetseq-train (hetseq/cli/train_options.h), as train_command.cpp reads it: the
// parser for the --task given, parse_command_line, read_train_options, the flags ranks compare, and the init method.
// An input is the arguments after the program name, one per line. See Note [Fuzz harnesses].
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/harness.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/core/error.h"
#include "hetseq/world/init_method.h"

namespace hetseq::fuzz {
namespace {

/// The environment --distributed-init-method env:// reads, fixed so that runs are reproducible.
const std::map<std::string, std::string>& fixed_environment() {
  static const std::map<std::string, std::string> env{{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "23456"}};
  return env;
}

void read_command_line(const std::vector<const char*>& argv) {
  const int argc = static_cast<int>(argv.size());
  cxxopts::Options parser = cli::make_train_parser(cli::find_task_flag(argc, argv.data()));
  const cxxopts::ParseResult args = cli::parse_command_line(parser, argc, argv.data());
  if (args.count("help")) {
    HETSEQ_ASSERT(!parser.help().empty(), "hetseq-train --help printed nothing");
    return;
  }
  const hetseq::TrainOptions o = cli::read_train_options(args);
  HETSEQ_ASSERT(!o.common.task.empty() && !o.dataset.max_sentences.empty() && !o.optimization.update_freq.empty() &&
                    !o.optimization.lr.empty() && o.dataset.valid_subsets.size() >= 1,
                "read_train_options accepted empty --task, --max-sentences, --update-freq, --lr or --valid-subset");
  const auto compared = cli::compared_flags(parser, args);
  HETSEQ_ASSERT(compared.count("--seed") == 1, "the compared flags lack --seed");
  if (!o.distributed.world.init_method.empty()) parse_init_method(o.distributed.world.init_method, fixed_environment());
}

}  // namespace

Outcome run_input(const uint8_t* data, size_t size) {
  std::vector<std::string> words{"hetseq-train"};
  std::string_view input(reinterpret_cast<const char*>(data), size);
  while (!input.empty()) {
    const size_t end = input.find('\n');
    words.emplace_back(input.substr(0, end));
    if (end == std::string_view::npos) break;
    input.remove_prefix(end + 1);
  }
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  return run_expecting<UsageError>([&] { read_command_line(argv); });
}

}  // namespace hetseq::fuzz
