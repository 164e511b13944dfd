#!/usr/bin/env bash
# Training throughput of two "nodes" joined by a shaped network link, per communication hook: hetseq-train
# (--ddp-comm-hook none, fp16, bf16, powersgd) and, for MNIST, PyTorch's Python DDP with the same hooks.
#
#   benchmarks/slow_network.sh [--rates LIST] [--hooks LIST] [--tasks LIST] [--updates N] [--repeats R]
#                              [--bert-updates N] [--powersgd-rank K] [--build DIR] [--python PY] [--data DIR] [--bert-data DIR]
#                              [--timeout S] [--no-peer]
#
# Needs root (ip netns, tc). Two network namespaces, node 0 at 10.78.0.1 and node 1 at 10.78.0.2, are joined by
# a veth pair whose two ends are shaped with a token bucket (tc tbf) to each rate of --rates (default
# 1gbit,10gbit). This kernel has no netem, so no delay is added: the latency is the veth's own (tens of µs), not
# a real switch's 0.1-0.2 ms. Each node runs one worker pinned to its own CPU (taskset), one intra-op thread,
# and the nodes meet over tcp:// on node 0's address, as users start them (--distributed-rank per node).
# Before the runs of a rate, a TCP stream between the namespaces measures what the shaped link carries.
#
# Tasks (--tasks, default mnist,bert):
#   mnist: MNISTNet (4.8 MB of gradients), batch 64 per node, Adam lr 0.001, --updates updates (default 100);
#          the Python peer is benchmarks/mnist_python_ddp_peer.py with --comm-hook.
#   bert:  tiny BERT (configs/bert-tiny.json) on the shards scripts/train_bert.sh makes, batch 16 per node,
#          --bert-updates updates (default 40); no Python peer across nodes (benchmarks/bert_python_peer.py
#          runs on one host).
# Hooks (--hooks, default none,fp16,bf16,powersgd): PowerSGD with rank --powersgd-rank (default 1) after 10
# uncompressed updates (--powersgd-start-update 10, the peer's start_powerSGD_iter 10).
#
# The figure is global samples/s over the training span (hetseq: rank 0's train_epoch wps, or ups x bsz for
# BERT; the peer: its own timing of the same span). For hetseq also the per-rank summary of the epoch
# (ranks_epoch): the time a bucket was in flight per update (comm_ms), the share of it hidden behind backward
# (comm_overlap: 1 - the wait after the last bucket / comm_ms) and the bus bandwidth, on rank 0. Every
# configuration runs --repeats times (default 3), hetseq and the peer alternating; the medians end the output.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
RATES="1gbit,10gbit"
HOOKS="none,fp16,bf16,powersgd"
TASKS="mnist,bert"
UPDATES=100
BERT_UPDATES=40
REPEATS=3
PSGD_RANK=1
BUILD="$ROOT/build"
PY="${HETSEQ_PYTHON:-$HETSEQ_HOME/venv-torch-2.11.0/bin/python}"
DATA="/usr/share/datasets/fashion-mnist"
BERT_DATA="$HETSEQ_HOME/bert/jargon-128"
TIMEOUT=300
PEER=1

while [ "$#" -gt 0 ]; do
  case "$1" in
    --rates) need_value "$@"; RATES="$2"; shift 2 ;;
    --hooks) need_value "$@"; HOOKS="$2"; shift 2 ;;
    --tasks) need_value "$@"; TASKS="$2"; shift 2 ;;
    --updates) need_value "$@"; UPDATES="$2"; shift 2 ;;
    --bert-updates) need_value "$@"; BERT_UPDATES="$2"; shift 2 ;;
    --repeats) need_value "$@"; REPEATS="$2"; shift 2 ;;
    --powersgd-rank) need_value "$@"; PSGD_RANK="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --python) need_value "$@"; PY="$2"; shift 2 ;;
    --data) need_value "$@"; DATA="$2"; shift 2 ;;
    --bert-data) need_value "$@"; BERT_DATA="$2"; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
    --no-peer) PEER=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
{ is_uint "$UPDATES" && [ "$UPDATES" -ge 12 ]; } || die "--updates: '$UPDATES' is not a whole number >= 12"
{ is_uint "$BERT_UPDATES" && [ "$BERT_UPDATES" -ge 12 ]; } || die "--bert-updates: '$BERT_UPDATES' is not a whole number >= 12"
{ is_uint "$REPEATS" && [ "$REPEATS" -ge 1 ]; } || die "--repeats: '$REPEATS' is not a positive integer"
[ "$(id -u)" = 0 ] || die "needs root for ip netns and tc"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
TRAIN="$BUILD/bin/hetseq-train"
[ -x "$TRAIN" ] || die "$TRAIN not found; build first (scripts/build.sh)"
[ -x "$PY" ] || die "python '$PY' not found; pass --python (scripts/setup.sh makes the venv)"
IFS=, read -r -a RATE_LIST <<<"$RATES"
IFS=, read -r -a HOOK_LIST <<<"$HOOKS"
IFS=, read -r -a TASK_LIST <<<"$TASKS"
for h in "${HOOK_LIST[@]}"; do case "$h" in none|fp16|bf16|powersgd) ;; *) die "--hooks: unknown hook '$h'" ;; esac; done
for t in "${TASK_LIST[@]}"; do
  case "$t" in
    mnist) [ -d "$DATA" ] || die "--data $DATA: no such directory" ;;
    bert) ls "$BERT_DATA"/*train*.hdf5 >/dev/null 2>&1 || die "--bert-data $BERT_DATA has no train shards; run scripts/train_bert.sh once" ;;
    *) die "--tasks: unknown task '$t' (mnist, bert)" ;;
  esac
done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

WORK="$(mktemp -d "${TMPDIR:-/tmp}/slow_network.XXXXXX")"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  netns_pair_delete
  rm -rf "$WORK"
}
trap cleanup EXIT
netns_pair_make sn 10.78.0

shape() {  # shape RATE: both ends of the link
  local burst=256kb
  [[ "$1" == *"10gbit"* ]] && burst=2mb
  ip netns exec "$NS0" tc qdisc replace dev "$DEV0" root tbf rate "$1" burst "$burst" latency 50ms
  ip netns exec "$NS1" tc qdisc replace dev "$DEV1" root tbf rate "$1" burst "$burst" latency 50ms
}

# What the shaped link carries: 256 MB over one TCP connection from node 1 to node 0, in Gbit/s.
probe_link() {
  ip netns exec "$NS0" "$PY" - <<'PYEOF' &
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("10.78.0.1", 29411)); s.listen(1)
c, _ = s.accept()
while c.recv(1 << 20):
    pass
PYEOF
  local server=$!
  sleep 1
  ip netns exec "$NS1" "$PY" - <<'PYEOF'
import socket, time
c = socket.create_connection(("10.78.0.1", 29411)); chunk = b"\0" * (1 << 20); t = time.perf_counter()
for _ in range(256):
    c.sendall(chunk)
c.shutdown(socket.SHUT_WR); c.recv(1); print("%.2f" % (256 * 8 * (1 << 20) / (time.perf_counter() - t) / 1e9))
PYEOF
  wait "$server" 2>/dev/null || true
}

PORT=29500
# run_nodes IMPL TASK HOOK: both nodes, each pinned to its own CPU; output in $WORK/node{0,1}.{out,err}.
run_nodes() {
  local impl="$1" task="$2" hook="$3" r
  PORT=$((PORT + 1))
  PIDS=()
  for r in 0 1; do
    local ns="NS$r" dev="DEV$r"
    # GLOO_SOCKET_IFNAME: PyTorch's Gloo otherwise picks its interface from the hostname, which a namespace lacks.
    # shellcheck disable=SC2046
    ip netns exec "${!ns}" env GLOO_SOCKET_IFNAME="${!dev}" taskset -c "$r" $(node_command "$impl" "$task" "$hook" "$r") \
      >"$WORK/node$r.out" 2>"$WORK/node$r.err" &
    PIDS+=("$!")
  done
  wait_node_pair "$TIMEOUT" "$impl $task $hook" "$WORK/node%d.err"
}

updates_of() { if [ "$1" = bert ]; then echo "$BERT_UPDATES"; else echo "$UPDATES"; fi; }

node_command() {
  local impl="$1" task="$2" hook="$3" r="$4"
  if [ "$impl" = hetseq ]; then
    echo "$TRAIN --cpu --optimizer adam --lr 0.001 --max-update $(updates_of "$task") --seed 1 --no-save --disable-validation"
    echo "--log-format json --log-interval 1000000 --intra-op-threads 1 --no-progress-bar --clip-norm 0"
    echo "--distributed-world-size 2 --distributed-gpus 1 --distributed-rank $r"
    echo "--distributed-init-method tcp://10.78.0.1:$PORT --distributed-timeout 120"
    echo "--ddp-comm-hook $hook --powersgd-rank $PSGD_RANK --powersgd-start-update 10"
    if [ "$task" = mnist ]; then
      echo "--task mnist --data $DATA --max-sentences 64 --num-workers 0"
    else
      echo "--task bert --data $BERT_DATA --config_file $ROOT/configs/bert-tiny.json --max-sentences 16"
      echo "--weight-decay 0.01 --lr_scheduler fixed --num-workers 1"
    fi
  else
    echo "$PY $ROOT/benchmarks/mnist_python_ddp_peer.py --data $DATA --init-method tcp://10.78.0.1:$PORT"
    echo "--world-size 2 --rank $r --batch-sizes 64,64 --max-update $UPDATES --threads 1 --seed 1"
    echo "--comm-hook $hook --powersgd-rank $PSGD_RANK --powersgd-start-update 10"
  fi
}

# "samples/s comm_ms overlap busbw" of the last run of TASK (the last three "-" for the peer).
figures() {
  "$PY" - "$1" "$WORK/node0.out" "$(updates_of "$2")" <<'PYEOF' || die "$1: no usable figure in $WORK/node0.out"
import json, sys
impl, path, updates = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
if impl == "python":
    r = rows[-1]
    assert int(r["updates"]) == updates, "the peer ran another number of updates"
    print("%.1f - - -" % r["samples_per_s"])
    sys.exit()
epoch = [r for r in rows if r.get("tag") == "train_epoch"][-1]
ranks = [r for r in rows if r.get("tag") == "ranks_epoch"][-1]
assert int(epoch["num_updates"]) == updates, "hetseq ran another number of updates (epoch too short?)"
print("%.1f %.2f %.2f %.3f" % (float(epoch["ups"]) * float(epoch["bsz"]), ranks["comm_ms"][0], ranks["comm_overlap"][0],
                              ranks["busbw_gb_per_s"][0]))
PYEOF
}

echo "# Two nodes over a shaped link (tc tbf, no added delay), one worker per node on its own CPU, 1 thread"
echo "# $UPDATES updates per MNIST run, $BERT_UPDATES per BERT run, $REPEATS repeats; hetseq: $TRAIN; peer: $PY (torch $("$PY" -c 'import torch; print(torch.__version__)'))"
echo "# machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(uname -r); start: $(uptime)"
RESULTS="$WORK/results"
: >"$RESULTS"
for rate in "${RATE_LIST[@]}"; do
  shape "$rate"
  echo "# rate $rate: one TCP stream carries $(probe_link) Gbit/s"
  printf '%-7s %-6s %-9s %-7s %-4s %10s %8s %8s %8s\n' rate task hook impl run samples/s comm_ms overlap busbw
  for task in "${TASK_LIST[@]}"; do
    for hook in "${HOOK_LIST[@]}"; do
      impls=(hetseq)
      [ "$PEER" = 1 ] && [ "$task" = mnist ] && impls=(hetseq python)
      for ((i = 1; i <= REPEATS; i++)); do
        order=("${impls[@]}")
        if ((i % 2 == 0)) && [ "${#impls[@]}" = 2 ]; then order=(python hetseq); fi
        for impl in "${order[@]}"; do
          run_nodes "$impl" "$task" "$hook"
          read -r v comm overlap busbw <<<"$(figures "$impl" "$task")"
          echo "$rate $task $hook $impl $v $comm $overlap $busbw" >>"$RESULTS"
          printf '%-7s %-6s %-9s %-7s %-4s %10s %8s %8s %8s\n' "$rate" "$task" "$hook" "$impl" "$i" "$v" "$comm" "$overlap" "$busbw"
        done
      done
    done
  done
done
echo "# end: $(uptime)"

"$PY" - "$RESULTS" <<'PYEOF'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    rate, task, hook, impl, v, comm, overlap, busbw = line.split()
    runs[(rate, task, hook, impl)].append((float(v), comm, overlap, busbw))
def med(key, i=0):
    vals = [float(r[i]) for r in runs[key] if r[i] != "-"]
    return statistics.median(vals) if vals else None
print("\n# medians: samples/s, hetseq's comm_ms and overlap, hetseq/python, speed-up over the same impl's none")
print("%-7s %-6s %-9s %10s %10s %8s %8s %8s %8s %8s" % ("rate", "task", "hook", "hetseq", "python", "comm_ms", "overlap",
                                                     "h/p", "h/none", "p/none"))
for (rate, task, hook, impl) in sorted(runs, key=lambda k: (k[0], k[1], ["none", "fp16", "bf16", "powersgd"].index(k[2]))):
    if impl != "hetseq":
        continue
    h, p = med((rate, task, hook, "hetseq")), med((rate, task, hook, "python"))
    hn, pn = med((rate, task, "none", "hetseq")), med((rate, task, "none", "python"))
    f = lambda x, fmt="%.1f": (fmt % x) if x is not None else "-"
    print("%-7s %-6s %-9s %10s %10s %8s %8s %8s %8s %8s" % (rate, task, hook, f(h), f(p), f(med((rate, task, hook, "hetseq"), 1), "%.2f"),
          f(med((rate, task, hook, "hetseq"), 2), "%.2f"), f(h / p if p else None, "%.2f"), f(h / hn if hn else None, "%.2f"),
          f(p / pn if p and pn else None, "%.2f")))
PYEOF
