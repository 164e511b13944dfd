#include "hetseq/reduce/comm_hook.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

CommHook parse_comm_hook(const std::string& value) {
  if (value == "none") return CommHook::kNone;
  if (value == "fp16") return CommHook::kFp16;
  if (value == "bf16") return CommHook::kBf16;
  if (value == "powersgd") return CommHook::kPowerSgd;
  throw UsageError(fmt::format("--ddp-comm-hook: '{}' is not one of none, fp16, bf16, powersgd", value));
}

std::string to_string(CommHook hook) {
  switch (hook) {
    case CommHook::kNone: return "none";
    case CommHook::kFp16: return "fp16";
    case CommHook::kBf16: return "bf16";
    case CommHook::kPowerSgd: return "powersgd";
  }
  return "?";
}

c10::ScalarType wire_type(CommHook hook) {
  switch (hook) {
    case CommHook::kFp16: return c10::ScalarType::Half;
    case CommHook::kBf16: return c10::ScalarType::BFloat16;
    default: return c10::ScalarType::Float;
  }
}

}  // namespace hetseq
