#pragma once
/// --zero-sharding's choices, apart from the sharding itself (zero_shard.h), which names c10d types.

#include <string>

namespace hetseq {

/// --zero-sharding: what is cut into shards over the ranks. See Note [Sharded optimizer state].
enum class ZeroSharding { kNone, kOptimizerState };

/// Parses --zero-sharding (`none`, `os`); throws hetseq::UsageError naming the flag otherwise.
ZeroSharding parse_zero_sharding(const std::string& text);
std::string to_string(ZeroSharding sharding);

}  // namespace hetseq
