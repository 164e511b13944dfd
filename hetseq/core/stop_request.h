#pragma once
/// SIGTERM and SIGINT as a request to stop cleanly: the training loop finishes the update in flight,
/// the ranks agree to stop, rank 0 saves checkpoint_last.pt, every rank leaves and the program exits
/// with kExitStopped. See Note [Clean stops].

namespace hetseq::stop_request {

/// Installs the handlers for SIGTERM and SIGINT in this process (idempotent). The first signal sets
/// the request; later ones are ignored, so that a terminal's SIGINT and the launcher's forwarded
/// SIGTERM count once (a supervisor that wants the process gone sends SIGKILL).
void install();

/// The signal that asked to stop (SIGTERM or SIGINT), or 0 when none did. Async-signal-safe to set,
/// cheap to read: the training loop reads it once per update.
int signal_number();

/// "SIGTERM", "SIGINT" (the name of a stop signal, for log lines).
const char* signal_name(int signal_number);

/// How many stop signals arrived (the launcher kills its workers at once on the second).
int signal_count();

/// Whether a stop was requested.
inline bool requested() { return signal_number() != 0; }

/// When this process was started by hetseq's launcher (HETSEQ_LAUNCHER_PID in the environment) or by
/// torchrun's agent (TORCHELASTIC_RUN_ID; the agent is the parent), makes it die with that launcher:
/// the kernel sends SIGKILL when the launcher exits (PR_SET_PDEATHSIG), and a launcher already gone
/// ends this process at once. A worker that outlived a killed agent would go on holding its peers (and
/// its GPU) in a world no agent supervises. Elsewhere does nothing.
void die_with_launcher();

}  // namespace hetseq::stop_request
