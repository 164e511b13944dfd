#include "hetseq/cli/per_rank_flags.h"

namespace hetseq {

const std::set<std::string>& per_rank_flags() {
  static const std::set<std::string> flags{
      // what a rank computes with: its share of each update, its device, its threads
      "max-sentences", "max-sentences-valid", "update-freq", "balance-cap", "device-id", "cpu", "distributed-backend",
      "intra-op-threads", "num-workers",
      "memory-budget",
      // who it is and how it finds the others (the world size and backend are compared as resolved)
      "distributed-rank", "distributed-gpus", "distributed-no-spawn", "distributed-init-method",
      "distributed-world-size", "distributed-timeout", "rendezvous-timeout", "checkpoint-timeout",
      // paths that differ by mount point (the data's sizes and the restored state are compared instead)
      "data", "save-dir", "restore-file", "dump-sample-ids", "trace-dir", "tensorboard-logdir", "json-log", "user-dir",
      // how it reports (whether a run traces is compared as resolved: the ranks align clocks together)
      "log-format", "log-interval", "no-progress-bar", "log-all-ranks", "trace-ops", "help"};
  return flags;
}

const std::set<std::string>& launcher_set_flags() {
  static const std::set<std::string> flags{"distributed-rank", "device-id", "intra-op-threads", "max-sentences", "balance-cap",
                                           "distributed-init-method", "distributed-world-size",
                                           "distributed-no-spawn"};
  return flags;
}

}  // namespace hetseq
