#pragma once
/// --zero-sharding's choices, apart from the sharding itself (sharding_strategy.h), which names c10d types.

#include <string>

namespace hetseq {

/// --zero-sharding: what is cut into shards over the ranks. Each choice is a ShardingStrategy
/// (make_sharding_strategy). `os+grad` and `full` are to come (issue 38). See Note [Sharded optimizer state].
enum class ZeroSharding { kNone, kOptimizerState };

/// Parses --zero-sharding (`none`, `os`); throws hetseq::UsageError naming the flag otherwise (`os+grad`
/// and `full`: not built yet).
ZeroSharding parse_zero_sharding(const std::string& text);
std::string to_string(ZeroSharding sharding);

}  // namespace hetseq
