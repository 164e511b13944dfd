#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace hetseq {

/// One instant that every rank takes as time 0 of its trace, and what each rank's system clock read
/// then. See Note [Tracing], "One clock".
struct ClockAlignment {
  std::chrono::steady_clock::time_point zero = std::chrono::steady_clock::now();
  int64_t system_us = 0;                  // this rank's system clock at `zero`, microseconds since 1970
  std::vector<int64_t> offsets_us;        // [rank] its system clock minus rank 0's, at `zero`
  int64_t spread_us = 0;                  // how far apart the ranks can have taken `zero` (the last round trip)
};

/// Every rank calls it at the same point, once, after the process group exists: a few tiny allreduces
/// (on `device`, so that NCCL works too), then each rank takes `zero` as the last one returns, and the
/// ranks' system clocks are summed over the group so that each knows the others' offsets.
ClockAlignment align_clocks(c10d::ProcessGroup& group, c10::Device device, int rounds = 5);

}  // namespace hetseq
