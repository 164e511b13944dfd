#pragma once
/// Aligning the ranks' trace clocks over the process group (the Tracer, in observe/, only holds the result).

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hetseq/observe/tracer.h"

namespace hetseq {

/// Every rank calls it at the same point, once, after the process group exists: a few tiny allreduces
/// (on `device`, so that NCCL works too), then each rank takes `zero` as the last one returns, and the
/// ranks' system clocks are summed over the group so that each knows the others' offsets.
ClockAlignment align_clocks(c10d::ProcessGroup& group, c10::Device device, int rounds = 5);

}  // namespace hetseq
