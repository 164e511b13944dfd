#include "hetseq/session/observe_flags.h"

#include "hetseq/core/error.h"
#include "hetseq/core/flag_text.h"
#include "hetseq/core/parse.h"
#include "hetseq/observe/tracer.h"

namespace hetseq {
namespace {

// --name with `value` as its default, or without a default when `value` is unset.
void add_path(FlagSet& flags, const std::string& name, const std::string& help,
              const std::optional<std::string>& value, const std::string& value_name = "VALUE") {
  if (value) {
    flags.add(name, help, *value, value_name);
  } else {
    flags.add_optional(name, help, value_name);
  }
}

// The text of --name when it has a value, which must not be empty.
std::optional<std::string> read_path(const FlagValues& values, const std::string& name) {
  if (!values.has(name)) return std::nullopt;
  std::string path = values.text(name);
  if (path.empty()) throw UsageError(fmt::format("--{}: empty path", name));
  return path;
}

}  // namespace

void declare_observe_flags(FlagSet& flags, const ObserveOptions& d) {
  add_path(flags, "trace-dir", "each rank writes the timeline of --trace-updates to DIR/trace_rank<R>.json (Chrome "
           "trace format: Perfetto, chrome://tracing); `hetseq-trace merge DIR` joins the ranks", d.trace_dir);
  flags.per_rank();
  flags.add("trace-updates", "the updates to trace with --trace-dir, A:B (1-based, both included)",
            fmt::format("{}:{}", d.trace_first, d.trace_last))
      .add_switch("trace-ops", "with --trace-dir, also LibTorch's op-level profile (Kineto) of the same updates, in "
                  "DIR/ops_rank<R>.json", d.trace_ops).per_rank();
  const std::optional<std::string> step_profile =
      d.step_profile_timed > 0 ? std::optional<std::string>(fmt::format("{},{}", d.step_profile_warmup,
                                                                        d.step_profile_timed))
                               : std::nullopt;
  add_path(flags, "step-profile", "measure the steady state: let WARMUP updates pass, then time TIMED updates and "
           "print one JSON line (tag step_profile: samples/s, data wait, host and device ms, ATen operators and host "
           "reads per update, peak memory; rank 0)", step_profile, "WARMUP,TIMED");
  add_path(flags, "tensorboard-logdir", "write the log's statistics as TensorBoard scalars into DIR (rank 0)",
           d.tensorboard_logdir);
  flags.per_rank();
  add_path(flags, "json-log", "append every log record as a JSON line to FILE, whatever --log-format prints (rank 0); "
           "scripts/plot_run.py draws it", d.json_log);
  flags.per_rank();
}

ObserveOptions read_observe_options(const FlagValues& values) {
  ObserveOptions f;
  f.trace_dir = read_path(values, "trace-dir");
  TraceOptions window;
  parse_trace_window(values.text("trace-updates"), window);  // throws naming the flag
  f.trace_first = window.first_update;
  f.trace_last = window.last_update;
  f.trace_ops = values.flag("trace-ops");
  if (f.trace_ops && !f.trace_dir) throw UsageError("--trace-ops: needs --trace-dir, where the op-level trace goes");
  if (values.has("step-profile")) {
    const std::string text = values.text("step-profile");
    const size_t comma = text.find(',');
    if (comma == std::string::npos) {
      throw UsageError(fmt::format("--step-profile: '{}' is not WARMUP,TIMED (e.g. 20,100)", text));
    }
    f.step_profile_warmup = parse_int("--step-profile WARMUP", text.substr(0, comma));
    f.step_profile_timed = parse_int("--step-profile TIMED", text.substr(comma + 1));
    if (f.step_profile_warmup < 1 || f.step_profile_timed < 1) {
      throw UsageError(fmt::format("--step-profile: {} needs WARMUP >= 1 and TIMED >= 1 updates", text));
    }
  }
  f.tensorboard_logdir = read_path(values, "tensorboard-logdir");
  f.json_log = read_path(values, "json-log");
  return f;
}

}  // namespace hetseq
