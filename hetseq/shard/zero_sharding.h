#pragma once
/// --zero-sharding's choices, apart from the sharding itself (sharding_strategy.h), which names c10d types.

#include <string>

namespace hetseq {

/// --zero-sharding: what is cut into shards over the ranks. Each choice is a ShardingStrategy
/// (make_sharding_strategy). `full` (the parameters too) is to come. See Note [Sharded optimizer state]
/// and Note [Sharded gradients].
enum class ZeroSharding { kNone, kOptimizerState, kGradients };

/// Parses --zero-sharding (`none`, `os`, `os+grad`); throws hetseq::UsageError naming the flag otherwise
/// (`full`: not built yet).
ZeroSharding parse_zero_sharding(const std::string& text);
std::string to_string(ZeroSharding sharding);
/// Whether each rank keeps only its shard of the optimizer state (`os` and `os+grad`).
inline bool shards_state(ZeroSharding sharding) { return sharding != ZeroSharding::kNone; }

}  // namespace hetseq
