#!/usr/bin/env bash
# Single-process MNIST training throughput: hetseq-train vs the same training in PyTorch's Python API.
#
#   benchmarks/mnist_throughput.sh [--updates N] [--repeats R] [--build DIR] [--python PY] [--data DIR]
#                                  [--cpu CPU] [--seed S] [--peer-bookkeeping] [--quiet-wait SECONDS]
#
# Runs `hetseq-train --task mnist` and benchmarks/mnist_python_peer.py alternately, R times each (the order
# flips every repeat: H P, P H, H P, ...), each for N updates of batch 64 with Adam (lr 0.001) on one
# intra-op thread (OMP_NUM_THREADS=MKL_NUM_THREADS=1, and `taskset -c CPU` when taskset exists). hetseq's
# figure is `wps` of its train_epoch JSON line (samples/s for MNIST, from the start of the epoch's first
# update to the end of the last); the peer times the same span. Prints every run, the medians and their
# ratio, and ends with "ratio hetseq/python: X.XX". Exits non-zero when a run fails or prints no figure.
#
# Defaults: --updates 300, --repeats 5, --build build (relative to the repository root),
# --python $HETSEQ_PYTHON or ~/.cache/hetseq/venv-torch-2.11.0/bin/python (the wheel hetseq links),
# --data /usr/share/datasets/fashion-mnist, --cpu 0, --seed 1. --peer-bookkeeping makes the peer also do
# hetseq's per-update extras (loss and accuracy read-back, fp64 gradient norm; see mnist_python_peer.py).
# The environment passes through to both programs (e.g. GLIBC_TUNABLES for allocator experiments).
# --quiet-wait S: before each run, wait up to S seconds (default 0) until the machine is idle (under 15%
# of all CPUs busy over 5 s): taskset keeps our run on one CPU but not other work off it. The "cpu%"
# column is the whole machine's CPU utilisation during the run, from /proc/stat: one busy CPU of the
# machine's (100/ncpu %) is the run alone; more means something else ran beside it.
# "faults/upd", "user s" and "sys s" are the whole process's minor page faults (divided by the number of
# updates; start-up included, about 100k faults for hetseq and 145k for the peer) and CPU seconds.
# Fails when hetseq-train changes during the benchmark (rebuilt by someone).
# See docs/BENCHMARKS.md for results.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
UPDATES=300
REPEATS=5
BUILD="build"
PY="${HETSEQ_PYTHON:-$HOME/.cache/hetseq/venv-torch-2.11.0/bin/python}"
DATA="/usr/share/datasets/fashion-mnist"
CPU=0
SEED=1
BATCH=64
PEER_ARGS=()
QUIET_WAIT=0


while [ "$#" -gt 0 ]; do
  case "$1" in
    --updates) need_value "$@"; UPDATES="$2"; shift 2 ;;
    --repeats) need_value "$@"; REPEATS="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --python) need_value "$@"; PY="$2"; shift 2 ;;
    --data) need_value "$@"; DATA="$2"; shift 2 ;;
    --cpu) need_value "$@"; CPU="$2"; shift 2 ;;
    --seed) need_value "$@"; SEED="$2"; shift 2 ;;
    --peer-bookkeeping) PEER_ARGS+=(--bookkeeping); shift ;;
    --quiet-wait) need_value "$@"; QUIET_WAIT="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
{ is_uint "$UPDATES" && [ "$UPDATES" -ge 1 ]; } || die "--updates: '$UPDATES' is not a positive integer"
{ is_uint "$REPEATS" && [ "$REPEATS" -ge 1 ]; } || die "--repeats: '$REPEATS' is not a positive integer"
is_uint "$CPU" || die "--cpu: '$CPU' is not a CPU number"
is_uint "$SEED" || die "--seed: '$SEED' is not a non-negative integer"
is_uint "$QUIET_WAIT" || die "--quiet-wait: '$QUIET_WAIT' is not a number of seconds"

case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
TRAIN="$BUILD/bin/hetseq-train"
PEER="$ROOT/benchmarks/mnist_python_peer.py"
[ -x "$TRAIN" ] || die "$TRAIN not found or not executable; build it first: ninja -C $BUILD hetseq-train"
[ -f "$PEER" ] || die "$PEER is missing"
[ -x "$PY" ] || die "python '$PY' not found; pass --python or set HETSEQ_PYTHON (scripts/setup.sh makes the venv)"
TORCH_VERSION="$("$PY" -c 'import torch, numpy; print(torch.__version__)' 2>/dev/null)" ||
  die "'$PY' cannot import torch and numpy; use the venv scripts/setup.sh makes"
[ -d "$DATA" ] ||
  die "--data $DATA: no such directory (apt-get install dataset-fashion-mnist, or point --data elsewhere)"

# hetseq's wps covers one epoch (its meters reset at each epoch), so all N updates must be in the first
# epoch, and full batches, to compare like with like.
NUM_SAMPLES="$("$PY" - "$DATA" <<'EOF'
import gzip, os, struct, sys
for name in ("train-labels-idx1-ubyte", "train-labels-idx1-ubyte.gz"):
    path = os.path.join(sys.argv[1], name)
    if os.path.exists(path):
        with (gzip.open if name.endswith(".gz") else open)(path, "rb") as f:
            print(struct.unpack(">I", f.read(8)[4:])[0])
        break
else:
    sys.exit("no train-labels-idx1-ubyte[.gz] in " + sys.argv[1])
EOF
)" || die "--data $DATA: cannot read the train label file"
MAX_UPDATES=$((NUM_SAMPLES / BATCH))
[ "$UPDATES" -le "$MAX_UPDATES" ] ||
  die "--updates $UPDATES: at most $MAX_UPDATES (the full batches of one epoch of $NUM_SAMPLES samples)"

PIN=()
if command -v taskset >/dev/null 2>&1; then
  taskset -c "$CPU" true 2>/dev/null || die "--cpu $CPU: taskset cannot pin to it (CPUs: $(nproc --all))"
  PIN=(taskset -c "$CPU")
else
  echo "mnist_throughput: taskset not found; runs are not pinned" >&2
fi
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

WORK="$(mktemp -d "${TMPDIR:-/tmp}/mnist_throughput.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# Runs "$@" and writes the child's "minor-faults user-seconds system-seconds" to $WORK/rusage; exits with
# the command's status (128+N for signal N).
measured() {
  "$PY" -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    f.write(f"{ru.ru_minflt} {ru.ru_utime:.2f} {ru.ru_stime:.2f}\n")
sys.exit(rc if rc >= 0 else 128 - rc)
' "$WORK/rusage" "$@"
}
TRAIN_ID="$(fingerprint "$TRAIN")"

# Prints the samples/s of one run on stdout; on failure prints what went wrong and exits.
run_hetseq() {
  local out="$WORK/hetseq.out" err="$WORK/hetseq.err" rc=0
  [ "$(fingerprint "$TRAIN")" = "$TRAIN_ID" ] || die "$TRAIN changed during the benchmark (rebuilt?); start again"
  measured "${PIN[@]}" "$TRAIN" --task mnist --data "$DATA" --max-sentences "$BATCH" --optimizer adam --lr 0.001 \
      --max-update "$UPDATES" --seed "$SEED" --cpu --no-save --disable-validation --log-format json \
      --log-interval 1000000 --num-workers 0 --intra-op-threads 1 --no-progress-bar --clip-norm 0 \
      >"$out" 2>"$err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 20 "$err" >&2
    die "hetseq-train exited with status $rc (the end of its stderr is above)"
  fi
  "$PY" - "$out" "$UPDATES" <<'EOF' || { tail -n 20 "$err" >&2; die "no usable train_epoch line from hetseq-train"; }
import json, sys
rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        row = json.loads(line)
        if row.get("tag") == "train_epoch":
            rows.append(row)
if len(rows) != 1:
    sys.exit(f"expected one train_epoch line, got {len(rows)}")
if int(rows[0]["num_updates"]) != int(sys.argv[2]):
    sys.exit(f"hetseq ran {rows[0]['num_updates']} updates, asked for {sys.argv[2]}")
print(float(rows[0]["wps"]))
EOF
}

run_python() {
  local out="$WORK/python.out" err="$WORK/python.err" rc=0
  measured "${PIN[@]}" "$PY" "$PEER" --data "$DATA" --max-update "$UPDATES" --batch-size "$BATCH" --threads 1 \
      --seed "$SEED" "${PEER_ARGS[@]}" >"$out" 2>"$err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 20 "$err" >&2
    die "the Python peer exited with status $rc (the end of its stderr is above)"
  fi
  "$PY" - "$out" "$UPDATES" <<'EOF' || { tail -n 20 "$err" >&2; die "no usable JSON line from the Python peer"; }
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip().startswith("{")]
if len(lines) != 1:
    sys.exit(f"expected one JSON line, got {len(lines)}")
row = json.loads(lines[0])
if int(row["updates"]) != int(sys.argv[2]):
    sys.exit(f"the peer ran {row['updates']} updates, asked for {sys.argv[2]}")
print(float(row["samples_per_s"]))
EOF
}

echo "# MNIST single-process training throughput (samples/s), hetseq vs PyTorch Python"
echo "# $UPDATES updates of batch $BATCH, Adam lr 0.001, 1 intra-op thread, ${PIN[*]:-unpinned}, $REPEATS repeats"
echo "# hetseq: $TRAIN"
echo "# python: $PY (torch $TORCH_VERSION)${PEER_ARGS[*]:+, peer with ${PEER_ARGS[*]}}"
[ -z "${GLIBC_TUNABLES:-}" ] || echo "# GLIBC_TUNABLES=$GLIBC_TUNABLES"
echo "# machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)"
echo "# start: $(uptime)"
printf '%-4s %-7s %10s %6s %5s %10s %7s %6s\n' run impl samples/s load1 cpu% faults/upd "user s" "sys s"

HETSEQ=()
PYTHON=()
for ((i = 1; i <= REPEATS; i++)); do
  if ((i % 2 == 1)); then order=(hetseq python); else order=(python hetseq); fi
  for impl in "${order[@]}"; do
    wait_quiet "$QUIET_WAIT"
    load="$(load1)"; before="$(cpu_jiffies)"
    if [ "$impl" = hetseq ]; then
      v="$(run_hetseq)"; HETSEQ+=("$v")
    else
      v="$(run_python)"; PYTHON+=("$v")
    fi
    cpu="$(cpu_percent "$before" "$(cpu_jiffies)")"
    read -r faults user sys <"$WORK/rusage"
    printf '%-4s %-7s %10.1f %6s %5s %10d %7s %6s\n' "$i" "$impl" "$v" "$load" "$cpu" $((faults / UPDATES)) \
      "$user" "$sys"
  done
done
echo "# end: $(uptime)"

"$PY" - "${#HETSEQ[@]}" "${HETSEQ[@]}" "${PYTHON[@]}" <<'EOF'
import statistics, sys
n = int(sys.argv[1])
h = [float(v) for v in sys.argv[2 : 2 + n]]
p = [float(v) for v in sys.argv[2 + n :]]
mh, mp = statistics.median(h), statistics.median(p)
print(f"hetseq samples/s: median {mh:.1f} (min {min(h):.1f}, max {max(h):.1f})")
print(f"python samples/s: median {mp:.1f} (min {min(p):.1f}, max {max(p):.1f})")
print(f"ratio hetseq/python: {mh / mp:.2f}")
EOF
