#include "hetseq/core/stop_request.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hetseq/core/error.h"

namespace hetseq::stop_request {
namespace {

std::atomic<int> g_signal{0};
std::atomic<int> g_count{0};
static_assert(std::atomic<int>::is_always_lock_free, "the stop request is set from a signal handler");

void on_signal(int number) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, number);
  g_count.fetch_add(1);
}

}  // namespace

// Note [Clean stops]
// ~~~~~~~~~~~~~~~~~~
// A cluster stops a job with SIGTERM (scancel, preemption, torchrun's agent) and kills it a grace
// period later (Slurm's KillWait, 30 s by default); a user stops one with Ctrl-C. hetseq turns either
// signal into a resumable stop:
//  * the launcher passes SIGTERM to each of its workers and kills those still running after its stop
//    grace (60 s); a worker it started dies with it (PR_SET_PDEATHSIG), so no worker is ever left
//    training as an orphan that holds its GPU;
//  * a worker's handler only records the signal. Ranks may see it at different updates (the signals
//    arrive at different times, or only some ranks get one), so the training loop does not act on it
//    alone: before each update it gives the reducer this rank's vote, the vote travels in a slot of
//    the update's statistics collective (Note [Stat sync]), and after the update every rank knows
//    whether any rank voted, from the same collective. So all ranks stop after the same update, and
//    agreeing costs no extra round trip;
//  * after that update the ranks save as at --max-update (rank 0 writes checkpoint_last.pt behind the
//    checkpoint fence, without validating first, to fit in the grace period), leave together, and
//    exit with kExitStopped. Running the same command again resumes exactly there.
// A worker ignores a second signal: a terminal's SIGINT and the launcher's forwarded SIGTERM often
// both arrive. A second signal to the launcher (Ctrl-C twice) kills the workers at once. Before the
// training loop runs (building, joining, resuming) the handlers are not installed yet, and a signal
// ends the process as usual: there is nothing to save.

void install() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
}

int signal_number() { return g_signal.load(std::memory_order_relaxed); }

const char* signal_name(int number) {
  switch (number) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

int signal_count() { return g_count.load(std::memory_order_relaxed); }

void die_with_launcher() {
  // hetseq's launcher names itself; torchrun's agent is the parent of the workers it starts (with
  // --no-python it runs this binary directly) and says nothing of its pid.
  pid_t launcher = 0;
  const char* name = "the launcher";
  if (const char* text = std::getenv("HETSEQ_LAUNCHER_PID"); text != nullptr && *text != '\0') {
    launcher = static_cast<pid_t>(std::strtol(text, nullptr, 10));
  } else if (const char* run = std::getenv("TORCHELASTIC_RUN_ID"); run != nullptr && *run != '\0') {
    launcher = ::getppid();
    name = "torchrun's agent";
  } else {
    return;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher may have died before the call above took effect: then our parent is someone else.
  // A launcher gone is a lost peer of the run, not a bug in hetseq: the exit-code table's answer to it is to
  // start the job again, which resumes from the last checkpoint (kExitPeerLost, as for a rank that died).
  if (::getppid() != launcher) {
    std::fprintf(stderr, "hetseq-train: %s (pid %d) is gone; this worker stops (exit code %d: run the job again "
                 "to resume from its last checkpoint)\n", name, static_cast<int>(launcher),
                 static_cast<int>(kExitPeerLost));
    std::_Exit(kExitPeerLost);
  }
}

}  // namespace hetseq::stop_request
