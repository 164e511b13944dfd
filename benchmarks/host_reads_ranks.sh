#!/usr/bin/env bash
# Host reads and speed of a steady-state update at three ranks on this machine's CPUs, for one or two builds
# side by side: hetseq-train on MNIST, 3 ranks spawned on one node over Gloo, each with one intra-op thread,
# --step-profile WARMUP,TIMED (rank 0's step_profile line: the dispatcher's host reads per update, samples/s over
# the timed span). Builds and sharding modes alternate run by run, R times each; the script prints every run and
# the medians, and with two builds each mode's samples/s of the second over the first.
#
#   benchmarks/host_reads_ranks.sh [--builds DIR[,DIR]] [--modes LIST] [--repeats R] [--profile W,T]
#                                  [--batch N] [--data DIR] [--timeout S]
#
# --builds: build folders (default build); --modes: --zero-sharding values (default none,full); --repeats
# (default 3); --profile (default 20,100); --batch: each rank's --max-sentences (default 32); --timeout S: a run
# that takes longer is killed and the benchmark fails (default 300).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
BUILDS="build"
MODES="none,full"
REPEATS=3
PROFILE="20,100"
BATCH=32
DATA="/usr/share/datasets/fashion-mnist"
TIMEOUT=300

while [ "$#" -gt 0 ]; do
  case "$1" in
    --builds) need_value "$@"; BUILDS="$2"; shift 2 ;;
    --modes) need_value "$@"; MODES="$2"; shift 2 ;;
    --repeats) need_value "$@"; REPEATS="$2"; shift 2 ;;
    --profile) need_value "$@"; PROFILE="$2"; shift 2 ;;
    --batch) need_value "$@"; BATCH="$2"; shift 2 ;;
    --data) need_value "$@"; DATA="$2"; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

IFS=, read -r -a builds <<<"$BUILDS"
IFS=, read -r -a modes <<<"$MODES"
for b in "${builds[@]}"; do
  case "$b" in /*) ;; *) b="$ROOT/$b" ;; esac
  [ -x "$b/bin/hetseq-train" ] || die "no hetseq-train in $b/bin (build it first)"
done
warmup="${PROFILE%,*}"
updates=$((warmup + ${PROFILE#*,}))
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

results="$work/results"  # lines: build mode reads samples_per_s
for ((rep = 1; rep <= REPEATS; ++rep)); do
  for mode in "${modes[@]}"; do
    for b in "${builds[@]}"; do
      dir="$b"; case "$dir" in /*) ;; *) dir="$ROOT/$dir" ;; esac
      out="$work/out"
      timeout --kill-after 10 "$TIMEOUT" "$dir/bin/hetseq-train" --task mnist --data "$DATA" --cpu \
        --distributed-world-size 3 --distributed-gpus 3 --distributed-init-method tcp://127.0.0.1:0 \
        --max-sentences "$BATCH" --optimizer adam --lr 0.001 --max-update "$updates" --disable-validation \
        --no-save --no-progress-bar --log-format json --log-interval 1000 --intra-op-threads 1 --num-workers 1 \
        --zero-sharding "$mode" --step-profile "$PROFILE" >"$out" 2>"$work/err" ||
        die "run $rep of $b with --zero-sharding $mode failed: $(tail -3 "$work/err")"
      line="$(grep '"tag":"step_profile"' "$out")" || die "no step_profile line from $b ($mode)"
      read -r reads sps < <(python3 -c 'import json,sys; p=json.loads(sys.argv[1]); print(p["host_reads_per_update"], p["samples_per_s"])' "$line")
      echo "$b $mode $reads $sps" >>"$results"
      printf 'run %d  %-24s %-5s host reads/update %-5s samples/s %.1f\n' "$rep" "$b" "$mode" "$reads" "$sps"
    done
  done
done

python3 - "$results" "$BUILDS" "$MODES" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
builds, modes = sys.argv[2].split(","), sys.argv[3].split(",")
med = {}
print("\nmedians (samples/s over the timed span, rank 0's host reads per update):")
for mode in modes:
    for b in builds:
        runs = [r for r in rows if r[0] == b and r[1] == mode]
        med[b, mode] = statistics.median(float(r[3]) for r in runs)
        reads = sorted({r[2] for r in runs})
        print(f"  {b:24s} {mode:5s} samples/s {med[b, mode]:8.1f}  host reads/update {','.join(reads)}")
    if len(builds) == 2:
        print(f"  {mode}: {builds[1]} / {builds[0]} = {med[builds[1], mode] / med[builds[0], mode]:.3f}x")
EOF
