#pragma once

#include <string>
#include <vector>

namespace hetseq {

/// The trace files to merge: each argument is a trace file, or a directory whose trace_rank<R>.json
/// files are taken (--trace-dir). Throws hetseq::InputError naming an argument that is neither.
std::vector<std::string> find_trace_files(const std::vector<std::string>& args);

/// Merges the ranks' traces (see Note [Tracing]) into one Chrome trace-event file at `out`, written
/// atomically: every event of every file, each rank staying its own process, sorted by time. The
/// files must come from one run (the same time zero; else hetseq::InputError naming both files) and
/// hold distinct ranks. Returns the number of events written.
size_t merge_traces(const std::vector<std::string>& files, const std::string& out);

}  // namespace hetseq
