#!/usr/bin/env bash
# Distributed MNIST training throughput on this machine's CPUs: hetseq-train against PyTorch's Python
# DistributedDataParallel (benchmarks/mnist_python_ddp_peer.py), case by case, alternating.
#
#   benchmarks/mnist_distributed_throughput.sh [--updates N] [--repeats R] [--cases LIST] [--build DIR]
#                                              [--python PY] [--data DIR] [--quiet-wait S] [--timeout S]
#                                              [--fast-stat-sync] [--comm-hook none|fp16|bf16|powersgd]
#
# Cases (name: ranks pinned to CPUs with taskset, batch size per rank):
#   one:           1 rank on CPU 0, batch 64
#   two:           2 ranks on CPUs 0 and 1, batches 64,64
#   three-equal:   3 ranks on CPUs 0,0,1 (ranks 0 and 1 share CPU 0), batches 64,64,64
#   three-hetero:  3 ranks on CPUs 0,0,1, speed-proportional batches 64,64,128 (rank 2 has a CPU alone)
# Every rank is its own process with one intra-op thread (OMP_NUM_THREADS=MKL_NUM_THREADS=1), started with
# `taskset -c CPU`; ranks meet over a fresh file:// rendezvous and reduce over Gloo on loopback. hetseq's
# ranks are started as users start one node each (`--distributed-no-spawn --distributed-rank r`); the
# single-rank case runs hetseq without a process group and the peer with DDP on a world of one.
# Each run is N updates (default 200) of Adam lr 0.001 within the first epoch; the figure is the global
# samples/s (all ranks) over the span from the first update to the end of the last: hetseq's `wps` of
# rank 0's train_epoch JSON line, the peer's own timing of the same span on rank 0. Per case the two
# implementations alternate (H P, P H, ...), R times each (default 3); the script prints every run, the
# medians, hetseq/python per case and each implementation's speed-up over its own one-rank case.
# --cases: comma list of case names (default all). --quiet-wait S: before each run wait up to S seconds
# for an idle machine (see mnist_throughput.sh). --timeout S: a run that takes longer is killed and the
# benchmark fails (default 300). "cpu%" is the whole machine's CPU use during the run (100 = both CPUs).
# --fast-stat-sync: hetseq's ranks sum their logged statistics in one small allreduce per update instead
# of gathering every rank's (two allgathers); the peer logs nothing and syncs no statistics either way.
# --comm-hook H: both implementations reduce with that DDP communication hook (hetseq --ddp-comm-hook H;
# PowerSGD after 10 uncompressed updates on both); the default is none.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
UPDATES=200
REPEATS=3
CASES="one,two,three-equal,three-hetero"
BUILD="build"
PY="${HETSEQ_PYTHON:-$HOME/.cache/hetseq/venv-torch-2.11.0/bin/python}"
DATA="/usr/share/datasets/fashion-mnist"
QUIET_WAIT=0
TIMEOUT=300
SEED=1
STAT_SYNC=""
HOOK=none

while [ "$#" -gt 0 ]; do
  case "$1" in
    --updates) need_value "$@"; UPDATES="$2"; shift 2 ;;
    --repeats) need_value "$@"; REPEATS="$2"; shift 2 ;;
    --cases) need_value "$@"; CASES="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --python) need_value "$@"; PY="$2"; shift 2 ;;
    --data) need_value "$@"; DATA="$2"; shift 2 ;;
    --quiet-wait) need_value "$@"; QUIET_WAIT="$2"; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
    --fast-stat-sync) STAT_SYNC="--fast-stat-sync"; shift ;;
    --comm-hook) need_value "$@"; HOOK="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
{ is_uint "$UPDATES" && [ "$UPDATES" -ge 1 ] && [ "$UPDATES" -le 234 ]; } ||
  die "--updates: '$UPDATES' is not in 1..234 (the full updates of 256 samples in one epoch of 60000)"
{ is_uint "$REPEATS" && [ "$REPEATS" -ge 1 ]; } || die "--repeats: '$REPEATS' is not a positive integer"
is_uint "$QUIET_WAIT" || die "--quiet-wait: '$QUIET_WAIT' is not a number of seconds"
{ is_uint "$TIMEOUT" && [ "$TIMEOUT" -ge 1 ]; } || die "--timeout: '$TIMEOUT' is not a positive number of seconds"

case_cpus() {
  case "$1" in one) echo 0 ;; two) echo 0,1 ;; three-equal|three-hetero) echo 0,0,1 ;; *) return 1 ;; esac
}
case_batches() {
  case "$1" in one) echo 64 ;; two) echo 64,64 ;; three-equal) echo 64,64,64 ;; three-hetero) echo 64,64,128 ;;
    *) return 1 ;; esac
}
IFS=, read -r -a CASE_LIST <<<"$CASES"
for c in "${CASE_LIST[@]}"; do
  case_cpus "$c" >/dev/null || die "--cases: unknown case '$c' (one, two, three-equal, three-hetero)"
done

case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
TRAIN="$BUILD/bin/hetseq-train"
PEER="$ROOT/benchmarks/mnist_python_ddp_peer.py"
[ -x "$TRAIN" ] || die "$TRAIN not found or not executable; build it first: ninja -C $BUILD hetseq-train"
[ -x "$PY" ] || die "python '$PY' not found; pass --python or set HETSEQ_PYTHON (scripts/setup.sh makes the venv)"
TORCH_VERSION="$("$PY" -c 'import torch, numpy; print(torch.__version__)' 2>/dev/null)" ||
  die "'$PY' cannot import torch and numpy; use the venv scripts/setup.sh makes"
[ -d "$DATA" ] || die "--data $DATA: no such directory (apt-get install dataset-fashion-mnist)"
command -v taskset >/dev/null 2>&1 || die "taskset not found (apt-get install util-linux)"
[ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ] || die "the cases pin ranks to CPUs 0 and 1; this machine has one CPU"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

WORK="$(mktemp -d "${TMPDIR:-/tmp}/mnist_dist_throughput.XXXXXX")"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
TRAIN_ID="$(fingerprint "$TRAIN")"
RUN=0

# Starts one process per rank (the command for rank r is "$@" with RANK/BATCH/WORLD/RDV substituted by
# the caller's function `rank_command`), waits for all with a deadline, and kills stragglers. Output of
# rank r in $WORK/$RUN.r.{out,err}.
run_ranks() {
  local impl="$1" cpus batches world r rc=0 deadline
  IFS=, read -r -a cpus <<<"$(case_cpus "$2")"
  IFS=, read -r -a batches <<<"$(case_batches "$2")"
  world="${#cpus[@]}"
  RUN=$((RUN + 1))
  local rdv="$WORK/rdv.$RUN"
  PIDS=()
  for ((r = 0; r < world; r++)); do
    # shellcheck disable=SC2046
    taskset -c "${cpus[$r]}" $(rank_command "$impl" "$world" "$r" "${batches[*]}" "$rdv") \
      >"$WORK/$RUN.$r.out" 2>"$WORK/$RUN.$r.err" &
    PIDS+=("$!")
  done
  deadline=$(($(date +%s) + TIMEOUT))
  for ((r = 0; r < world; r++)); do
    while kill -0 "${PIDS[$r]}" 2>/dev/null; do
      if [ "$(date +%s)" -ge "$deadline" ]; then
        for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
        tail -n 20 "$WORK/$RUN.$r.err" >&2
        die "$impl, case $2: rank $r still running after --timeout $TIMEOUT s; killed all ranks"
      fi
      sleep 0.2
    done
    wait "${PIDS[$r]}" || rc=$?
    if [ "$rc" -ne 0 ]; then
      for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
      tail -n 20 "$WORK/$RUN.$r.err" >&2
      die "$impl, case $2: rank $r exited with status $rc (the end of its stderr is above)"
    fi
  done
  PIDS=()
}

rank_command() {
  local impl="$1" world="$2" r="$3" rdv="$5" batches
  read -r -a batches <<<"$4"
  if [ "$impl" = hetseq ]; then
    echo "$TRAIN --task mnist --data $DATA --max-sentences ${batches[$r]} --optimizer adam --lr 0.001"
    echo "--max-update $UPDATES --seed $SEED --cpu --no-save --disable-validation --log-format json"
    echo "--log-interval 1000000 --num-workers 0 --intra-op-threads 1 --no-progress-bar --clip-norm 0"
    if [ "$world" -gt 1 ]; then
      echo "--distributed-no-spawn --distributed-world-size $world --distributed-rank $r"
      echo "--distributed-init-method file://$rdv --distributed-timeout 120 $STAT_SYNC"
      echo "--ddp-comm-hook $HOOK --powersgd-start-update 10"
    fi
  else
    local list
    list="$(IFS=,; echo "${batches[*]}")"
    echo "$PY $PEER --data $DATA --init-method file://$rdv --world-size $world --rank $r"
    echo "--batch-sizes $list --max-update $UPDATES --threads 1 --seed $SEED"
    if [ "$world" -gt 1 ]; then echo "--comm-hook $HOOK --powersgd-start-update 10"; fi
  fi
}

# Rank 0's samples/s of the last run.
figure() {
  local impl="$1" out="$WORK/$RUN.0.out"
  "$PY" - "$impl" "$out" "$UPDATES" <<'PYEOF' || die "$impl: no usable figure in $out"
import json, sys
impl, path, updates = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
if impl == "hetseq":
    rows = [r for r in rows if r.get("tag") == "train_epoch"]
    key, n = "wps", "num_updates"
else:
    key, n = "samples_per_s", "updates"
if len(rows) != 1:
    sys.exit(f"expected one result line, got {len(rows)}")
if int(rows[0][n]) != updates:
    sys.exit(f"ran {rows[0][n]} updates, asked for {updates}")
print(float(rows[0][key]))
PYEOF
}

echo "# MNIST distributed training throughput (global samples/s), hetseq vs PyTorch Python DDP"
echo "# $UPDATES updates per run, Adam lr 0.001, 1 intra-op thread per rank, Gloo on loopback, $REPEATS repeats"
echo "# hetseq: $TRAIN${STAT_SYNC:+ $STAT_SYNC}; comm hook $HOOK"
echo "# python: $PY $PEER (torch $TORCH_VERSION)"
echo "# machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)"
echo "# start: $(uptime)"
printf '%-13s %-4s %-7s %10s %6s %5s\n' case run impl samples/s load1 cpu%

RESULTS="$WORK/results"
: >"$RESULTS"
for c in "${CASE_LIST[@]}"; do
  for ((i = 1; i <= REPEATS; i++)); do
    if ((i % 2 == 1)); then order=(hetseq python); else order=(python hetseq); fi
    for impl in "${order[@]}"; do
      [ "$(fingerprint "$TRAIN")" = "$TRAIN_ID" ] || die "$TRAIN changed during the benchmark (rebuilt?)"
      wait_quiet "$QUIET_WAIT"
      load="$(load1)"; before="$(cpu_jiffies)"
      run_ranks "$impl" "$c"
      cpu="$(cpu_percent "$before" "$(cpu_jiffies)")"
      v="$(figure "$impl")"
      echo "$c $impl $v" >>"$RESULTS"
      printf '%-13s %-4s %-7s %10.1f %6s %5s\n' "$c" "$i" "$impl" "$v" "$load" "$cpu"
    done
  done
done
echo "# end: $(uptime)"

"$PY" - "$RESULTS" <<'PYEOF'
import collections, statistics, sys
runs = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    case, impl, v = line.split()
    if case not in order:
        order.append(case)
    runs[(case, impl)].append(float(v))
med = {k: statistics.median(v) for k, v in runs.items()}
print(f"{'case':<13} {'hetseq':>9} {'python':>9} {'hetseq/python':>14} {'hetseq/one':>11} {'python/one':>11}")
for case in order:
    h, p = med[(case, "hetseq")], med[(case, "python")]
    hs = f"{h / med[('one', 'hetseq')]:.2f}" if ("one", "hetseq") in med else "-"
    ps = f"{p / med[('one', 'python')]:.2f}" if ("one", "python") in med else "-"
    print(f"{case:<13} {h:9.1f} {p:9.1f} {h / p:14.2f} {hs:>11} {ps:>11}")
PYEOF
