#include "hetseq/core/error.h"

namespace hetseq::detail {

void assertion_failed(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(fmt::format("internal error: {} ({}:{}: {} is false); please report this", msg, file,
                                  line, cond));
}

}  // namespace hetseq::detail
