#include "hetseq/world/lost_peer.h"

#include <array>
#include <cstring>
#include <string>
#include <typeinfo>

#include <c10/util/Exception.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

// Note [Lost peers in collectives]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// When a rank dies, Gloo sees its sockets close: the survivors' next collective with it fails at once
// with Gloo's own exception ("Read error [10.0.0.2]:4711: Connection reset by peer", "Connection closed
// by peer ...", or "Timed out waiting 20000ms for recv operation to complete" when it hangs), which
// Work::wait() rethrows as it is: a gloo::IoException, not a c10::DistError. Uncaught, that was exit
// code 1 ("a bug in hetseq") with Gloo's raw line, where a supervisor needs code 4 ("lost peer: restart")
// and a person a line naming what failed. So every wait on a collective goes through wait_for_peers(),
// which turns any failure into a PeerError naming the rank and the collective (the reducer's comm hook,
// the statistics and the gathers do the same in their own words), and the drivers also classify an error
// that escaped unwrapped (from inside LibTorch, say) by is_lost_peer(): c10d's DistError, an exception
// whose type is Gloo's (its mangled name starts with the gloo namespace: the type itself is not exported
// by LibTorch, so a dynamic_cast could not name it), or a message with Gloo's words for a lost peer (an
// error that LibTorch re-raised as its own c10::Error). Gloo cannot tell which rank an address belongs
// to, so the line names the collective; the rank that died shows as killed (128 + its signal), and the
// fence names it when it died during a save (Note [Lost writers]).

void wait_for_peers(const c10::intrusive_ptr<c10d::Work>& work, int64_t rank, int64_t world_size,
                    std::string_view what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
    throw PeerError(fmt::format("rank {} of {}: the {} failed: {} (a peer died, fell behind past the process "
                                "group's timeout, or reached a different collective)",
                                rank, world_size, what, torch_error ? torch_error->what_without_backtrace() : e.what()));
  }
}

bool is_lost_peer(const std::exception& e) {
  if (dynamic_cast<const c10::DistError*>(&e) != nullptr) return true;
  if (std::strncmp(typeid(e).name(), "N4gloo", 6) == 0) return true;
  static constexpr std::array<const char*, 7> kGlooWords{"Read error [",        "Write error [",
                                                         "Connection closed by peer", "onnection reset by peer",
                                                         "Broken pipe",         "Timed out waiting ",
                                                         "Socket Timeout"};
  const std::string text = e.what();
  for (const char* words : kGlooWords) {
    if (text.find(words) != std::string::npos) return true;
  }
  return false;
}

}  // namespace hetseq
