#pragma once
// Helpers of the Controller's update that its source files share (controller.cpp, controller_graph.cpp,
// controller_late.cpp, controller_state.cpp); not API.

#include <cstdint>

#include "hetseq/core/error.h"
#include "hetseq/task/task.h"

namespace hetseq::detail {

/// Adds `from`'s sums into `into`, name by name.
void add_into(LogSums& into, const LogSums& from);
/// The error of an update whose gradient norm `gnorm` is not finite.
InputError diverged(int64_t update, double gnorm);
/// A step's statistics into an update's sums: the host ones (sample_size from its field) and the device ones.
void add_step(LogSums& into, LogTensors& into_tensors, const StepOutput& step);
/// The seed of an update's randomness, from (seed, update, rank).
uint64_t update_seed(uint64_t seed, int64_t num_updates, int64_t rank);

}  // namespace hetseq::detail
