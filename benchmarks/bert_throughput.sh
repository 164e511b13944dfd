#!/usr/bin/env bash
# Tiny-BERT pretraining throughput (sequences/s) on CPU workers: hetseq-train --task bert on 1 and 2 workers vs
# the same training in PyTorch's Python API (benchmarks/bert_python_peer.py, 1 and 2 workers with DDP/Gloo).
#
#   benchmarks/bert_throughput.sh [--updates N] [--repeats R] [--batch B] [--config FILE] [--data DIR]
#                                 [--build DIR] [--python PY] [--precision fp32|bf16|fp16]
#
# Each configuration (hetseq 1 worker, Python 1 worker, hetseq 2 workers, Python 2 workers) runs R times,
# alternately (the order of hetseq and Python flips every repeat), N updates of B sequences per worker
# (128 tokens each with the default data), Adam (lr 0.001, weight decay 0.01), no clipping, no validation, one
# intra-op thread per worker. hetseq's figure is ups x bsz of its train_epoch JSON line (sequences over the span
# from the first update's start to the last one's end); the peer times the same span. Prints every run, then
# the medians, and the machine's 1-minute load average before each run.
#
# --precision bf16 or fp16 runs both programs' forward passes under CPU autocast (hetseq-train --bf16 or
# --fp16; the peer with torch.autocast, and a GradScaler for fp16).
#
# Defaults: --updates 100, --repeats 3, --batch 16, --config configs/bert-tiny.json,
# --data $HETSEQ_HOME/bert/jargon-128 (made by scripts/train_bert.sh), --build build,
# --python $HETSEQ_PYTHON or ~/.cache/hetseq/venv-torch-2.11.0/bin/python. See docs/BENCHMARKS.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
UPDATES=100
REPEATS=3
BATCH=16
CONFIG="$ROOT/configs/bert-tiny.json"
DATA="$HETSEQ_HOME/bert/jargon-128"
BUILD="$ROOT/build"
PY="${HETSEQ_PYTHON:-$HETSEQ_HOME/venv-torch-2.11.0/bin/python}"
PRECISION=fp32

die() { echo "bert_throughput: error: $*" >&2; exit 1; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --updates) UPDATES="$2"; shift 2 ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --batch) BATCH="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$PRECISION" in
  fp32) PRECISION_FLAGS=() ;;
  bf16|fp16) PRECISION_FLAGS=(--"$PRECISION") ;;
  *) die "--precision: '$PRECISION' is not one of fp32, bf16, fp16" ;;
esac
TRAIN="$BUILD/bin/hetseq-train"
[ -x "$TRAIN" ] || die "$TRAIN not found; build first (scripts/build.sh)"
ls "$DATA"/*train*.hdf5 >/dev/null 2>&1 || die "--data $DATA has no train shards; run scripts/train_bert.sh once"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bert_throughput.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

hetseq() {  # hetseq WORKERS -> sequences/s
  local dist=()
  [ "$1" -gt 1 ] && dist=(--distributed-world-size "$1" --distributed-gpus "$1" --distributed-init-method tcp://127.0.0.1:0)
  "$TRAIN" --task bert --data "$DATA" --config_file "$CONFIG" --cpu "${dist[@]}" --max-sentences "$BATCH" \
    --max-update "$UPDATES" --optimizer adam --lr 0.001 --weight-decay 0.01 --clip-norm 0 --lr_scheduler fixed \
    --disable-validation --no-save --log-format json --log-interval 1000000 --intra-op-threads 1 --num-workers 1 \
    --no-progress-bar "${PRECISION_FLAGS[@]}" >"$WORK/out" 2>"$WORK/err" || { tail -n 5 "$WORK/err" >&2; die "hetseq-train failed"; }
  "$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and "\"train_epoch\"" in l]
r = rows[-1]
assert int(r["num_updates"]) == int(sys.argv[2]), "hetseq ran another number of updates (epoch too short?)"
print("%.1f" % (float(r["ups"]) * float(r["bsz"])))' "$WORK/out" "$UPDATES"
}
python_peer() {  # python_peer WORKERS -> sequences/s
  "$PY" "$ROOT/benchmarks/bert_python_peer.py" --data "$DATA" --config "$CONFIG" --updates "$UPDATES" \
    --batch-size "$BATCH" --workers "$1" --precision "$PRECISION" >"$WORK/out" 2>"$WORK/err" || { tail -n 5 "$WORK/err" >&2; die "peer failed"; }
  "$PY" -c 'import json, sys; print("%.1f" % json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["sequences_per_s"])' "$WORK/out"
}
median() { "$PY" -c 'import statistics, sys; print("%.1f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }

echo "tiny BERT throughput: $UPDATES updates of $BATCH sequences per worker, $(basename "$CONFIG"), $PRECISION, data $DATA"
for workers in 1 2; do
  h=(); p=()
  for ((r = 1; r <= REPEATS; r++)); do
    for side in $( ((r % 2)) && echo "hetseq python" || echo "python hetseq"); do
      load="$(cut -d' ' -f1 /proc/loadavg)"
      if [ "$side" = hetseq ]; then v="$(hetseq "$workers")"; h+=("$v"); else v="$(python_peer "$workers")"; p+=("$v"); fi
      printf '  %d worker(s)  run %d  %-7s %8s seq/s   (load before: %s)\n' "$workers" "$r" "$side" "$v" "$load"
    done
  done
  mh="$(median "${h[@]}")"; mp="$(median "${p[@]}")"
  printf '%d worker(s): hetseq %s seq/s, python %s seq/s (medians), ratio hetseq/python %s\n' "$workers" "$mh" "$mp" \
    "$("$PY" -c "print('%.2f' % ($mh / $mp))")"
done
