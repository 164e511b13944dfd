#pragma once

#include <string>

#include <c10/core/ScalarType.h>

namespace hetseq {

/// How a gradient bucket travels over the network (--ddp-comm-hook, PyTorch DDP's hook names). See
/// Note [Comm hooks].
enum class CommHook {
  kNone,      // float32, summed exactly as computed: the default, bit-exact weighting
  kFp16,      // cast to float16 for the allreduce and back: half the bytes, float16's rounding and range
  kBf16,      // cast to bfloat16: half the bytes, float32's range, 8 bits of mantissa
  kPowerSgd,  // low-rank approximation with error feedback (--powersgd-rank)
};

/// Parses a --ddp-comm-hook value; hetseq::UsageError naming the flag and the choices otherwise.
CommHook parse_comm_hook(const std::string& value);
std::string to_string(CommHook hook);
/// The element type that goes on the wire for fp16 and bf16; float32 otherwise.
c10::ScalarType wire_type(CommHook hook);

}  // namespace hetseq
