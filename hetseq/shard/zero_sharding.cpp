#include "hetseq/shard/zero_sharding.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

ZeroSharding parse_zero_sharding(const std::string& text) {
  if (text == "none") return ZeroSharding::kNone;
  if (text == "os") return ZeroSharding::kOptimizerState;
  if (text == "os+grad") return ZeroSharding::kGradients;
  if (text == "full") return ZeroSharding::kFull;
  throw UsageError(fmt::format("--zero-sharding: '{}' is not one of none, os, os+grad, full", text));
}

std::string to_string(ZeroSharding sharding) {
  switch (sharding) {
    case ZeroSharding::kNone:
      return "none";
    case ZeroSharding::kOptimizerState:
      return "os";
    case ZeroSharding::kGradients:
      return "os+grad";
    default:
      return "full";
  }
}

}  // namespace hetseq
