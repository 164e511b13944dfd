// hetseq-trace: works on the traces hetseq-train --trace-dir writes. See Note [Tracing].
//
//   hetseq-trace merge DIR|FILE... [-o OUT]   the ranks' traces as one file (default DIR/trace.json)
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "hetseq/cli/train_command.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/observe/trace_merge.h"

namespace {

constexpr const char* kUsage =
    "usage: hetseq-trace merge DIR|FILE... [-o OUT]\n"
    "  Merges the trace_rank<R>.json files that hetseq-train --trace-dir DIR wrote (each rank's timeline)\n"
    "  into one Chrome trace-event file, OUT (default: DIR/trace.json, or trace.json for files), to open in\n"
    "  https://ui.perfetto.dev or chrome://tracing.\n";

int trace_command(int argc, const char* const argv[]) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] != "merge") {
    throw hetseq::UsageError(fmt::format("unknown command '{}'; the command is merge", args[0]));
  }
  std::vector<std::string> inputs;
  std::string out;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "-o" || args[i] == "--output") {
      if (i + 1 >= args.size()) throw hetseq::UsageError("merge: -o needs a file name");
      out = args[++i];
    } else {
      inputs.push_back(args[i]);
    }
  }
  if (inputs.empty()) throw hetseq::UsageError("merge: give the --trace-dir directory or trace files");
  if (out.empty()) {
    out = inputs.size() == 1 && std::filesystem::is_directory(inputs[0])
              ? (std::filesystem::path(inputs[0]) / "trace.json").string()
              : "trace.json";
  }
  const std::vector<std::string> files = hetseq::find_trace_files(inputs);
  const size_t n = hetseq::merge_traces(files, out);
  fmt::print("merged {} trace file(s), {} events, into {}\n", files.size(), n, out);
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) { return hetseq::cli::run_guarded(trace_command, "hetseq-trace", argc, argv); }
