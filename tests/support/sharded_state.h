#pragma once
// The unsharded optimizer state of a --zero-sharding os run, gathered from every rank's shard: what the
// tests compare with an unsharded optimizer's state(). Checkpoints never gather it (each rank keeps its
// shard in its own file: Note [Sharded optimizer state in checkpoints]), so the library has no such call.

#include <map>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

#include "hetseq/shard/sharded_optimizer.h"

namespace hetseq::test {

/// A collective over `group` (the optimizer's): every rank's state_piece() to every rank, put together in
/// the unsharded optimizer's form: lr, num_steps, num_params, and for each parameter that has stepped
/// "param.{i}.step" and its full-size buffers "param.{i}.{buffer}". Throws std::runtime_error when the
/// ranks hold different buffers.
std::map<std::string, torch::Tensor> gather_sharded_state(const hetseq::ShardedOptimizer& optimizer,
                                                          const c10::intrusive_ptr<c10d::ProcessGroup>& group);

}  // namespace hetseq::test
