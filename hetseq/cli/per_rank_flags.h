#pragma once

#include <set>
#include <string>

namespace hetseq {

/// The general flags whose value may differ from rank to rank, by long name without dashes: those that
/// their declaration marks per_rank() (batch sizes, update-freq, device and rank, the node's worker count,
/// data loading threads, paths of data, logs, checkpoints and dumps, how a rank logs). Every other flag, a
/// task's included, is compared across ranks at start (see Note [Compared flags]); the launcher sets some
/// of these per worker (launcher_set_flags).
const std::set<std::string>& per_rank_flags();

/// The flags the launcher sets on each worker's command line (all per-rank), by long name; their
/// values on the node's command line are replaced.
const std::set<std::string>& launcher_set_flags();

}  // namespace hetseq
