#!/usr/bin/env bash
# What a newcomer waits for, from a fresh clone: the cold build of the main job's programs with ccache off, the
# main job (one epoch of Fashion-MNIST on 2 CPU workers) and the whole test suite, each timed.
#
#   benchmarks/fresh_clone.sh [--steps build,main,suite] [--commit REV] [--from REPO] [--dir DIR]
#
# Clones REPO (default: the repository this script is in) at REV (default: HEAD) into DIR (default: a new
# /tmp/hetseq-fresh.XXXXXX: a new path, so that ccache, keyed on the path, misses most of the build), then runs the
# steps in this order, one after the other:
#   build  CCACHE_DISABLE=1 bash scripts/build.sh --target hetseq-train hetseq-eval hetseq-trace (configure
#          included): its wall time and user CPU
#   main   bash scripts/train_mnist.sh (after build: the training alone; without it, its build too): its wall time
#          and the test accuracy it prints
#   suite  bash scripts/test.sh (it builds what is missing): its wall time, ctest's own time and its passed line
# Each step's output goes to DIR/fresh-clone-logs/STEP.log; one line per step on stdout, e.g.
#   build: 253 s wall, 452 s user CPU
#   main: 58 s wall, test accuracy: 88.30% (loss 0.456 bits)
#   suite: 545 s wall, ctest 223 s, 100% tests passed, 0 tests failed out of 153
# Run it with nothing else running (the figures are of the machine); DIR is left for inspection. Exit code 1 when a
# step fails (its log says why).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
STEPS="build,main,suite"
COMMIT=HEAD
FROM="$ROOT"
DIR=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --steps) need_value "$@"; STEPS="$2"; shift 2 ;;
    --commit) need_value "$@"; COMMIT="$2"; shift 2 ;;
    --from) need_value "$@"; FROM="$2"; shift 2 ;;
    --dir) need_value "$@"; DIR="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
for step in ${STEPS//,/ }; do
  case "$step" in build|main|suite) ;; *) die "--steps: '$step' is not one of build, main, suite" ;; esac
done
[ -n "$DIR" ] || DIR="$(mktemp -d /tmp/hetseq-fresh.XXXXXX)"
[ ! -e "$DIR" ] || [ -z "$(ls -A "$DIR")" ] || die "--dir $DIR is not empty; name a new folder"

git clone -q "$FROM" "$DIR"
git -C "$DIR" checkout -q "$COMMIT"
logs="$DIR/fresh-clone-logs"
mkdir -p "$logs"
echo "fresh clone of $(git -C "$DIR" rev-parse --short HEAD) in $DIR (logs: $logs)"

# Runs step $1's command (the rest) in the clone, its output to its log; sets `wall` (s) and `user` (CPU s of the
# command and its children).
timed() {
  local name="$1" t0 TIMEFORMAT='%U'
  shift
  t0=$(date +%s)
  { time (cd "$DIR" && "$@" >"$logs/$name.log" 2>&1); } 2>"$logs/$name.user" ||
    die "step $name failed after $(( $(date +%s) - t0 )) s: see $logs/$name.log"
  wall=$(( $(date +%s) - t0 ))
  user="$(tail -n 1 "$logs/$name.user" | cut -d. -f1)"
}

for step in ${STEPS//,/ }; do
  case "$step" in
    build)
      timed build env CCACHE_DISABLE=1 bash scripts/build.sh --target hetseq-train hetseq-eval hetseq-trace
      echo "build: $wall s wall, ${user:-?} s user CPU" ;;
    main)
      timed main bash scripts/train_mnist.sh
      echo "main: $wall s wall, $(grep -m1 '^test accuracy' "$logs/main.log" || echo 'no test accuracy line')" ;;
    suite)
      timed suite bash scripts/test.sh
      ctest_s="$(grep -m1 'Total Test time (real)' "$logs/suite.log" | grep -o '[0-9.]* sec' | cut -d. -f1)"
      echo "suite: $wall s wall, ctest ${ctest_s:-?} s, $(grep -m1 'tests passed' "$logs/suite.log" || echo 'no ctest summary')" ;;
  esac
done
