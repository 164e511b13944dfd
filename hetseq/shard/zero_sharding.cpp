#include "hetseq/shard/zero_sharding.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

ZeroSharding parse_zero_sharding(const std::string& text) {
  if (text == "none") return ZeroSharding::kNone;
  if (text == "os") return ZeroSharding::kOptimizerState;
  if (text == "os+grad" || text == "full") {
    throw UsageError(fmt::format("--zero-sharding: '{}' is not one of none, os ({} is not built yet: issue 38; see "
                                 "Note [Sharded optimizer state])",
                                 text, text));
  }
  throw UsageError(fmt::format("--zero-sharding: '{}' is not one of none, os", text));
}

std::string to_string(ZeroSharding sharding) { return sharding == ZeroSharding::kNone ? "none" : "os"; }

}  // namespace hetseq
