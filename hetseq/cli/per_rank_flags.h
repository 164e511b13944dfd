#pragma once

#include <set>
#include <string>

namespace hetseq {

/// The flags whose value may differ from rank to rank, by long name without dashes: batch sizes,
/// update-freq, device and rank, the node's worker count, data loading threads, paths of data, logs,
/// checkpoints and dumps, and how a rank logs. Every other flag, a task's included, is compared across
/// ranks at start (see Note [Compared flags]); the launcher sets some of these per worker
/// (launcher_set_flags). The one list of per-rank flags: add a flag here only when ranks may
/// legitimately differ in it.
const std::set<std::string>& per_rank_flags();

/// The flags the launcher sets on each worker's command line (all per-rank), by long name; their
/// values on the node's command line are replaced.
const std::set<std::string>& launcher_set_flags();

}  // namespace hetseq
