#include "hetseq/shard/zero_sharding.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

ZeroSharding parse_zero_sharding(const std::string& text) {
  if (text == "none") return ZeroSharding::kNone;
  if (text == "os") return ZeroSharding::kOptimizerState;
  if (text == "os+grad") return ZeroSharding::kGradients;
  if (text == "full") {
    throw UsageError("--zero-sharding: 'full' is not one of none, os, os+grad (sharding the parameters too is not "
                     "built yet; os+grad shards the gradients and the optimizer state)");
  }
  throw UsageError(fmt::format("--zero-sharding: '{}' is not one of none, os, os+grad", text));
}

std::string to_string(ZeroSharding sharding) {
  switch (sharding) {
    case ZeroSharding::kNone:
      return "none";
    case ZeroSharding::kOptimizerState:
      return "os";
    default:
      return "os+grad";
  }
}

}  // namespace hetseq
