#pragma once
// Ranks as processes of the test binary: for bodies that ranks as threads (support/rank_threads.h) cannot run.
// Note [CUDA backward needs a process per rank]: LibTorch's autograd engine runs the backward work of every
// caller on one thread per device, and c10d::Reducer waits for its buckets' collectives in a callback at the
// end of backward on that thread. Ranks as threads of one process with their models on one GPU therefore share
// that thread: the first rank to end its backward waits there for a collective whose peers' backward is queued
// behind it, and the group times out. One process per rank, as users run, has one engine per rank.

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "support/subprocess.h"

namespace hetseq::test {

/// Runs the hidden test case `test_name` of this binary as `world` processes that meet over a FileStore in
/// `dir`, each with `env` added; waits at most `deadline` for all of them. A rank reads its place with
/// rank_process() and writes what it saw under rank_process().dir for the calling test to check.
std::vector<ProcessResult> run_rank_processes(const std::string& test_name, int world, const std::string& dir,
                                              std::chrono::seconds deadline,
                                              const std::map<std::string, std::string>& env = {});

/// Inside a process that run_rank_processes started: its rank, the world size, the folder shared with the
/// calling test, and a Gloo group of the world (10 s collective timeout).
struct RankProcess {
  int rank = -1;
  int world = 0;
  std::string dir;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};
RankProcess rank_process();

}  // namespace hetseq::test
