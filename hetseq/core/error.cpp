#include "hetseq/core/error.h"

#include <atomic>

namespace hetseq {
namespace {
std::atomic<bool> g_peer_failure{false};
}  // namespace

PeerError::PeerError(const std::string& what) : InputError(what) { g_peer_failure = true; }

bool peer_failure_seen() { return g_peer_failure.load(); }

}  // namespace hetseq

namespace hetseq::detail {

void assertion_failed(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(fmt::format("internal error: {} ({}:{}: {} is false); please report this", msg, file,
                                  line, cond));
}

}  // namespace hetseq::detail
