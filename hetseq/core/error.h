#pragma once
/// Errors of hetseq. See STYLE: a user or input error throws with a message that says what, where and
/// what to do; a broken internal invariant is an assertion. Both are exceptions so failure paths are
/// testable; the drivers turn them into one line and an exit code.

#include <stdexcept>
#include <string>

#include "hetseq/core/format.h"

namespace hetseq {

/// A bad command line: unknown or malformed flag, invalid combination. Drivers exit with code 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

/// Bad input found while working: a missing or corrupt file, an unwritable directory, ranks that
/// disagree. Drivers exit with kExitInput.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

/// A peer was lost: a rank died, never arrived, or fell behind past a timeout, so a collective or a
/// wait on the store failed. Restarting the run (and resuming from the last checkpoint) can succeed,
/// so drivers exit with kExitPeerLost. It is an InputError, so code that handles bad input handles it.
/// Constructing one records that a peer failed (peer_failure_seen), because the backend may hand the
/// error on wrapped in its own exception type.
class PeerError : public InputError {
 public:
  explicit PeerError(const std::string& what);
};

/// Whether a PeerError was raised in this process (on any thread).
bool peer_failure_seen();

/// The exit codes of hetseq's programs, for supervisors (torchrun, Slurm, scripts) to tell apart what
/// to restart. Documented as a table in the README ("On a cluster").
enum ExitCode : int {
  kExitDone = 0,       // finished
  kExitInternal = 1,   // a bug in hetseq (InternalError) or an unclassified failure
  kExitUsage = 2,      // bad command line: do not restart, fix the flags
  kExitInput = 3,      // bad input: a file, shard or checkpoint; do not restart, fix the input
  kExitPeerLost = 4,   // a peer died or a timeout ran out: restart, the run resumes from its checkpoint
  kExitStopped = 5,    // stopped by SIGTERM or SIGINT after saving checkpoint_last.pt: run again to resume
};

/// A broken internal invariant (a bug in hetseq, not in the user's input).
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

namespace detail {
[[noreturn]] void assertion_failed(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace hetseq

/// Checks an internal invariant; throws hetseq::InternalError with file and line when it is broken.
#define HETSEQ_ASSERT(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      ::hetseq::detail::assertion_failed(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    }                                                                                         \
  } while (0)
