#!/usr/bin/env bash
# Bus bandwidth of hetseq's gradient reduction against one raw allreduce of a flat buffer of the same
# size, over Gloo on loopback (see benchmarks/reduction_bandwidth.cpp for what is timed).
#
#   benchmarks/reduction_bandwidth.sh [--build DIR] [--iters K] [--repeats R] [--timeout S]
#                                     [--shared-memory-reduce auto|on|off]
#
# Cases: the MNIST model (1.2 M parameters, 4.8 MB of gradients) and a synthetic 25 M-parameter model
# (100 MB, 16 tensors; several 25 MiB buckets), each on 2 ranks pinned to CPUs 0 and 1 and on 3 ranks
# pinned to 0,0,1. Each case runs R times (default 3); each run reports medians over K steps (default
# 30). Prints every run's JSON lines, then a table of the medians over runs: time, algbw, busbw, and
# hetseq/raw (the reducer's bus bandwidth over the raw allreduce's), and that ratio net of the local backward
# pass (building the loss and writing the gradients, timed alone), which the reducer's span includes.
# --shared-memory-reduce (default auto, as hetseq-train): the ranks being on one machine, auto and on sum the
# reducer's buckets through shared memory (Note [Shared-memory reduction]); off keeps Gloo for both sides.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
BUILD="build"
ITERS=30
REPEATS=3
TIMEOUT=300
SHM=auto
while [ "$#" -gt 0 ]; do
  case "$1" in
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --iters) need_value "$@"; ITERS="$2"; shift 2 ;;
    --repeats) need_value "$@"; REPEATS="$2"; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
    --shared-memory-reduce) need_value "$@"; SHM="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ "$ITERS" =~ ^[1-9][0-9]*$ ]] || die "--iters: '$ITERS' is not a positive integer"
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "--repeats: '$REPEATS' is not a positive integer"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
BIN="$BUILD/bin/reduction-bandwidth"
[ -x "$BIN" ] || die "$BIN not found; build it: ninja -C $BUILD reduction-bandwidth"
command -v taskset >/dev/null || die "taskset not found (apt-get install util-linux)"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/reduction_bandwidth.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results"
: >"$RESULTS"
run=0
for model in "--model mnist" "--numel 25000000"; do
  for cpus in 0,1 0,0,1; do
    IFS=, read -r -a pin <<<"$cpus"
    world="${#pin[@]}"
    for ((i = 1; i <= REPEATS; i++)); do
      run=$((run + 1))
      pids=()
      for ((r = 0; r < world; r++)); do
        # shellcheck disable=SC2086
        timeout -k 5 "$TIMEOUT" taskset -c "${pin[$r]}" "$BIN" --world-size "$world" --rank "$r" \
          --store-file "$WORK/store.$run" --iters "$ITERS" --shared-memory-reduce "$SHM" $model >"$WORK/out.$run.$r" 2>"$WORK/err.$run.$r" &
        pids+=("$!")
      done
      for ((r = 0; r < world; r++)); do
        wait "${pids[$r]}" || { cat "$WORK/err.$run.$r" >&2; die "run $run: rank $r failed (pins $cpus, $model)"; }
      done
      sed "s/^{/{\"pins\": \"$cpus\", /" "$WORK/out.$run.0" | tee -a "$RESULTS"
    done
  done
done
python3 - "$RESULTS" <<'PYEOF'
import collections, json, statistics, sys
rows = collections.defaultdict(list)
local = collections.defaultdict(list)  # [(model, pins)] the local backward's ms, one per run
model = None
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["side"] == "local_backward":  # printed after its run's two lines, without the model's name
        local[(model, r["pins"])].append(r["median_ms"])
        continue
    model = r["model"]
    rows[(r["model"], r["pins"], r["side"])].append(r)
print(f"{'model':<10} {'pins':<6} {'side':<15} {'MB':>7} {'buckets':>7} {'ms':>8} {'algbw GB/s':>10} {'busbw GB/s':>10}")
cases = sorted({(m, p) for m, p, _ in rows})
for m, p in cases:
    bus = {}
    for side in ("hetseq_reducer", "raw_allreduce"):
        rs = rows[(m, p, side)]
        ms = statistics.median(r["median_ms"] for r in rs)
        alg = statistics.median(r["algbw_GBps"] for r in rs)
        bus[side] = statistics.median(r["busbw_GBps"] for r in rs)
        print(f"{m:<10} {p:<6} {side:<15} {rs[0]['bytes'] / 1e6:7.1f} {rs[0]['buckets']:7d} {ms:8.2f} {alg:10.3f} {bus[side]:10.3f}")
    print(f"{m:<10} {p:<6} hetseq/raw busbw: {bus['hetseq_reducer'] / bus['raw_allreduce']:.2f}")
    # The reducer's span includes building the loss and the backward pass that writes the gradients, which on
    # one CPU per rank cannot overlap the allreduces; net of that work (timed alone, without communication):
    if local[(m, p)]:
        lb = statistics.median(local[(m, p)])
        red = statistics.median(r["median_ms"] for r in rows[(m, p, "hetseq_reducer")])
        raw = statistics.median(r["median_ms"] for r in rows[(m, p, "raw_allreduce")])
        print(f"{m:<10} {p:<6} local backward {lb:.2f} ms; hetseq/raw busbw net of it: {raw / (red - lb):.2f}")
PYEOF
