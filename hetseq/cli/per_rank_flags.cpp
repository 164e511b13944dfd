#include "hetseq/cli/per_rank_flags.h"

#include "hetseq/cli/train_options.h"

namespace hetseq {

const std::set<std::string>& per_rank_flags() {
  static const std::set<std::string> flags = [] {
    std::set<std::string> names;
    for (const FlagSet& set : cli::general_flags()) {
      for (const FlagSpec& f : set.flags()) {
        if (f.per_rank) names.insert(f.name);
      }
    }
    return names;
  }();
  return flags;
}

const std::set<std::string>& launcher_set_flags() {
  static const std::set<std::string> flags{"distributed-rank", "device-id", "intra-op-threads", "max-sentences", "balance-cap",
                                           "distributed-init-method", "distributed-world-size",
                                           "distributed-no-spawn"};
  return flags;
}

}  // namespace hetseq
