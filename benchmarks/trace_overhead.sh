#!/usr/bin/env bash
# What seeing a run costs: MNIST on 2 CPU ranks (CPUs 0 and 1, one intra-op thread each, 64+64 samples
# per update, Adam, file:// rendezvous, Gloo on loopback), the variants alternating within each repeat:
#   off:    no trace, no JSON log, no TensorBoard (the per-rank summary runs in every distributed run)
#   trace:  --trace-dir with every update of the run in the window (--trace-updates 1:N), the worst case
#   all:    trace, plus --json-log, --tensorboard-logdir and --log-interval 10 (the outputs' records)
# A run's figure is the global samples/s from its first update to its last: `wps` of rank 0's
# train_epoch JSON line. Prints every run, the medians and trace/off, all/off (target >= 0.97).
#
#   benchmarks/trace_overhead.sh [--repeats R] [--updates N] [--build DIR] [--data DIR] [--out DIR]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
REPEATS=5
UPDATES=300
BUILD="build"
DATA="/usr/share/datasets/fashion-mnist"
OUT=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --repeats) need_value "$@"; REPEATS="$2"; shift 2 ;;
    --updates) need_value "$@"; UPDATES="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --data) need_value "$@"; DATA="$2"; shift 2 ;;
    --out) need_value "$@"; OUT="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "--repeats: '$REPEATS' is not a positive integer"
{ [[ "$UPDATES" =~ ^[1-9][0-9]*$ ]] && [ "$UPDATES" -le 468 ]; } ||
  die "--updates: '$UPDATES' is not in 1..468 (full updates of 128 samples in one epoch of 60000)"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
TRAIN="$BUILD/bin/hetseq-train"
[ -x "$TRAIN" ] || die "$TRAIN not found; build it first: bash scripts/build.sh"
"$TRAIN" --help 2>/dev/null | grep -q -- '--trace-dir' || die "$TRAIN has no --trace-dir flag; rebuild it"
[ -d "$DATA" ] || die "--data $DATA: no such directory (apt-get install dataset-fashion-mnist)"
command -v taskset >/dev/null 2>&1 || die "taskset not found (apt-get install util-linux)"
[ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ] || die "the ranks are pinned to CPUs 0 and 1; this machine has one CPU"
if [ -z "$OUT" ]; then OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT; fi
mkdir -p "$OUT"

# One run of variant $1 (repeat $2): prints "variant repeat samples/s".
one_run() {
  local variant="$1" repeat="$2" dir="$OUT/$1-$2" pids=() r extra=()
  rm -rf "$dir"; mkdir -p "$dir"
  case "$variant" in
    off) ;;
    trace) extra=(--trace-dir "$dir/trace" --trace-updates "1:$UPDATES") ;;
    all) extra=(--trace-dir "$dir/trace" --trace-updates "1:$UPDATES" --json-log "$dir/log.jsonl"
                --tensorboard-logdir "$dir/tb" --log-interval 10) ;;
  esac
  for r in 0 1; do
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c "$r" "$TRAIN" --task mnist --data "$DATA" --cpu \
      --max-sentences 64 --optimizer adam --lr 0.001 --max-update "$UPDATES" --disable-validation --no-save \
      --save-dir "$dir/ck" --log-format json --no-progress-bar --intra-op-threads 1 --num-workers 1 \
      --distributed-world-size 2 --distributed-rank "$r" --distributed-no-spawn \
      --distributed-init-method "file://$dir/rendezvous" --distributed-timeout 120 "${extra[@]}" \
      >"$dir/out$r.txt" 2>"$dir/err$r.txt" &
    pids+=("$!")
  done
  for p in "${pids[@]}"; do
    wait "$p" || die "a $variant run failed; see $dir/err*.txt"
  done
  local wps
  wps="$(grep '"tag":"train_epoch"' "$dir/out0.txt" | tail -n 1 | sed 's/.*"wps":\([0-9.]*\).*/\1/')"
  [ -n "$wps" ] || die "no train_epoch line in $dir/out0.txt"
  echo "$variant $repeat $wps"
}

echo "# trace_overhead: $UPDATES updates, 2 ranks on CPUs 0 and 1, $REPEATS repeats; $(uptime)"
RESULTS="$OUT/results.txt"
: >"$RESULTS"
for ((i = 1; i <= REPEATS; i++)); do
  if ((i % 2 == 1)); then order=(off trace all); else order=(all trace off); fi
  for v in "${order[@]}"; do one_run "$v" "$i" | tee -a "$RESULTS"; done
done
awk '
  { v[$1] = v[$1] " " $3 }
  function median(list,    a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    off = median(v["off"]); tr = median(v["trace"]); al = median(v["all"])
    printf "median samples/s: off %.0f, trace %.0f, all %.0f\n", off, tr, al
    printf "trace/off %.3f, all/off %.3f (target >= 0.97)\n", tr / off, al / off
  }' "$RESULTS"
