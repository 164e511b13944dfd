#pragma once
/// --zero-sharding's choices, apart from the sharding itself (sharding_strategy.h), which names c10d types.

#include <string>

namespace hetseq {

/// --zero-sharding: what is cut into shards over the ranks. Each choice is a ShardingStrategy
/// (make_sharding_strategy). See Note [Sharded optimizer state], Note [Sharded gradients] and Note [Sharded
/// parameters].
enum class ZeroSharding { kNone, kOptimizerState, kGradients, kFull };

/// Parses --zero-sharding (`none`, `os`, `os+grad`, `full`); throws hetseq::UsageError naming the flag
/// otherwise.
ZeroSharding parse_zero_sharding(const std::string& text);
std::string to_string(ZeroSharding sharding);
/// Whether each rank keeps only its shard of the optimizer state (`os`, `os+grad`, `full`).
inline bool shards_state(ZeroSharding sharding) { return sharding != ZeroSharding::kNone; }
/// Whether each rank keeps only its shard of the summed gradients (`os+grad`, `full`): the ShardReducer.
inline bool shards_gradients(ZeroSharding sharding) {
  return sharding == ZeroSharding::kGradients || sharding == ZeroSharding::kFull;
}
/// Whether each rank keeps only its shard of the parameters between passes, gathering units around them
/// (`full`): UnitGather (Note [Sharded parameters]).
inline bool shards_parameters(ZeroSharding sharding) { return sharding == ZeroSharding::kFull; }

}  // namespace hetseq
