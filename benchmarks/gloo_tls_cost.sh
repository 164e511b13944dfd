#!/usr/bin/env bash
# What Gloo over TLS costs (docs/security.md, Note [Gloo over TLS]): two "nodes" in two network namespaces joined
# by an unshaped virtual Ethernet link, one rank each, pinned to its own CPU, once over plain Gloo and once with a
# job secret (--distributed-secret-file: TLS 1.3 pairs), alternating, --repeats times; medians at the end.
#
#   benchmarks/gloo_tls_cost.sh [--repeats R] [--updates N] [--numel N] [--iters K] [--build DIR] [--data DIR]
#                               [--timeout S]
#
# Needs root (ip netns). Figures, each for plain and TLS and their ratio:
#   mnist samples/s  hetseq-train MNIST, batch 64 per node, Adam, --updates updates (default 100): rank 0's
#                    train_epoch ups x bsz; and the bus bandwidth of its gradient buckets (ranks_epoch).
#   bucket busbw     reduction-bandwidth's raw allreduce of one flat float32 buffer of --numel elements (default
#                    110 M: BERT-base's gradients, 440 MB), median of --iters (default 5) after 3 warm-ups, GB/s.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
REPEATS=3
UPDATES=100
NUMEL=110000000
ITERS=5
BUILD="$ROOT/build"
DATA="/usr/share/datasets/fashion-mnist"
TIMEOUT=600
while [ "$#" -gt 0 ]; do
  case "$1" in
    --repeats) need_value "$@"; REPEATS="$2"; shift 2 ;;
    --updates) need_value "$@"; UPDATES="$2"; shift 2 ;;
    --numel) need_value "$@"; NUMEL="$2"; shift 2 ;;
    --iters) need_value "$@"; ITERS="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --data) need_value "$@"; DATA="$2"; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for v in REPEATS UPDATES NUMEL ITERS TIMEOUT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--$(echo "$v" | tr 'A-Z' 'a-z'): '${!v}' is not a positive whole number"
done
[ "$(id -u)" = 0 ] || die "needs root for ip netns"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
TRAIN="$BUILD/bin/hetseq-train" BANDWIDTH="$BUILD/bin/reduction-bandwidth"
[ -x "$TRAIN" ] && [ -x "$BANDWIDTH" ] || die "$TRAIN or $BANDWIDTH not found; build first (scripts/build.sh, then cmake --build build --target reduction-bandwidth)"
[ -d "$DATA" ] || die "--data $DATA: no such directory"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gloo_tls_cost.XXXXXX")"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  netns_pair_delete
  rm -rf "$WORK"
}
trap cleanup EXIT
netns_pair_make tc 10.79.0
"$TRAIN" --make-secret "$WORK/job.secret" >/dev/null

# run_both NAME COMMAND-OF-RANK: both ranks, rank r in namespace r on CPU r, within --timeout (wait_node_pair);
# output in $WORK/NAME.{0,1}.{out,err}.
run_both() {
  local name="$1" make="$2" r
  PIDS=()
  for r in 0 1; do
    local ns="NS$r"
    # shellcheck disable=SC2046
    ip netns exec "${!ns}" taskset -c "$r" $("$make" "$r") >"$WORK/$name.$r.out" 2>"$WORK/$name.$r.err" &
    PIDS+=("$!")
  done
  wait_node_pair "$TIMEOUT" "$name" "$WORK/$name.%d.err"
}

PORT=29600
SECRET_ARGS=""
mnist_rank() {
  echo "$TRAIN --task mnist --data $DATA --cpu --max-sentences 64 --num-workers 0 --optimizer adam --lr 0.001"
  echo "--max-update $UPDATES --seed 1 --no-save --disable-validation --log-format json --log-interval 1000000"
  echo "--intra-op-threads 1 --no-progress-bar --distributed-world-size 2 --distributed-gpus 1 --distributed-rank $1"
  echo "--distributed-init-method tcp://10.79.0.1:$PORT --distributed-timeout 120 $SECRET_ARGS"
}
bucket_rank() {
  echo "$BANDWIDTH --world-size 2 --rank $1 --store-file $WORK/store.$PORT --numel $NUMEL --iters $ITERS"
  echo "--master-host 10.79.0.1 $SECRET_ARGS"
}

echo "# Gloo over TLS against plain Gloo: two network namespaces, an unshaped veth, one rank each on its own CPU"
echo "# $UPDATES MNIST updates a run, a bucket of $NUMEL floats x $ITERS, $REPEATS repeats; $TRAIN"
echo "# machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); start: $(uptime)"
printf '%-6s %-4s %12s %12s %14s\n' mode run mnist_sps mnist_busbw bucket_busbw
RESULTS="$WORK/results"
: >"$RESULTS"
for run in $(seq 1 "$REPEATS"); do
  for mode in plain tls; do
    if [ "$mode" = tls ]; then SECRET_ARGS="--distributed-secret-file $WORK/job.secret"; else SECRET_ARGS=""; fi
    PORT=$((PORT + 1))
    run_both "mnist-$mode-$run" mnist_rank
    if [ "$mode" = tls ]; then
      grep -q "Gloo's connections over TLS" "$WORK/mnist-$mode-$run.0.err" || die "the TLS run did not use TLS"
      SECRET_ARGS="--secret-file $WORK/job.secret"
    fi
    PORT=$((PORT + 1))
    run_both "bucket-$mode-$run" bucket_rank
    python3 - "$mode" "$run" "$WORK/mnist-$mode-$run.0.out" "$WORK/bucket-$mode-$run.0.out" "$UPDATES" <<'PYEOF' | tee -a "$RESULTS"
import json, sys
mode, run, mnist, bucket, updates = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
rows = [json.loads(l) for l in open(mnist) if l.strip().startswith("{")]
epoch = [r for r in rows if r.get("tag") == "train_epoch"][-1]
ranks = [r for r in rows if r.get("tag") == "ranks_epoch"][-1]
assert int(epoch["num_updates"]) == updates, "hetseq ran another number of updates"
raw = [json.loads(l) for l in open(bucket) if '"raw_allreduce"' in l][-1]
print("%-6s %-4s %12.1f %12.3f %14.3f" % (mode, run, float(epoch["ups"]) * float(epoch["bsz"]),
                                          ranks["busbw_gb_per_s"][0], raw["busbw_GBps"]))
PYEOF
  done
done
python3 - "$RESULTS" <<'PYEOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = {m: [statistics.median(float(r[i]) for r in rows if r[0] == m) for i in (2, 3, 4)] for m in ("plain", "tls")}
print("# medians       mnist_sps  mnist_busbw  bucket_busbw")
for m in ("plain", "tls"):
    print("%-12s %12.1f %12.3f %14.3f" % (m, *med[m]))
print("%-12s %12.3f %12.3f %14.3f" % ("tls/plain", *(t / p for t, p in zip(med["tls"], med["plain"]))))
PYEOF
