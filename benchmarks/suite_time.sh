#!/usr/bin/env bash
# The test suite's time: ctest in BUILD_DIR at -j JOBS, its wall time and the CPU time of everything it
# started (the processes of a cpuacct cgroup of its own, so that the test zygote and the daemons that
# tests start count too; Note [Test zygote], tests/support/zygote_server.cpp), and how busy that kept
# the machine's cores. Run it with nothing else running: it waits up to 120 s for a quiet machine.
#   benchmarks/suite_time.sh BUILD_DIR [JOBS] [CTEST_ARGS...]
# JOBS defaults to scripts/test.sh's (cores + 1). Prints one line:
#   suite: 134/134 passed, wall 281 s, cpu 512 s (182% of 2 cores), -j3
# Needs a writable cgroup v1 cpuacct hierarchy (/sys/fs/cgroup/cpuacct); without it the CPU is not given.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ "${1:-}" != "--help" ] || { usage; exit 0; }
build="$(cd "${1:?usage: suite_time.sh BUILD_DIR [JOBS] [CTEST_ARGS...]}" && pwd)"
cores="$(nproc)"
jobs="${2:-$((cores + 1))}"
shift $(( $# >= 2 ? 2 : 1 ))
wait_quiet 120
cg=""
if [ -w /sys/fs/cgroup/cpuacct ]; then
  cg="/sys/fs/cgroup/cpuacct/hetseq_suite_$$"
  mkdir "$cg"
  trap 'rmdir "$cg" 2>/dev/null || true' EXIT
fi
log="$(mktemp "${TMPDIR:-/tmp}/suite_time.XXXXXX.log")"
t0="$(date +%s.%N)"
rc=0
# ctest in the cgroup: the subshell moves itself in before it starts ctest.
( [ -z "$cg" ] || echo "$BASHPID" >"$cg/cgroup.procs"; exec ctest --test-dir "$build" -j "$jobs" --timeout 600 "$@" ) \
  >"$log" 2>&1 || rc=$?
t1="$(date +%s.%N)"
# The zygote leaves a moment after the stop fixture: its CPU is counted once it has.
for _ in $(seq 50); do
  [ -z "$cg" ] || [ -z "$(cat "$cg/cgroup.procs")" ] && break
  sleep 0.1
done
passed="$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1 \2/p' "$log")"
read -r failed total <<<"${passed:-? ?}"
wall="$(python3 -c "print(round($t1 - $t0))")"
if [ -n "$cg" ]; then
  cpu="$(python3 -c "print(round($(cat "$cg/cpuacct.usage") / 1e9))")"
  busy="$(python3 -c "print(round(100 * $cpu / $wall))")"
  echo "suite: $((total - failed))/$total passed, wall $wall s, cpu $cpu s ($busy% of $cores cores), -j$jobs (log $log)"
else
  echo "suite: $((total - failed))/$total passed, wall $wall s, -j$jobs (log $log; no cpuacct cgroup for the CPU)"
fi
exit "$rc"
