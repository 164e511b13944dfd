#!/usr/bin/env bash
# BERT pretraining throughput in the steady state: hetseq-train against a strong PyTorch peer, eager and compiled
# (benchmarks/bert_python_peer.py), over a sweep of batch sizes; and the data path alone (benchmarks/bert_data.cpp).
#
#   benchmarks/bert_throughput.sh [--device cpu|cuda] [--batches 16,32] [--warmup W] [--updates T]
#                                 [--systems hetseq,peer,peer-compiled,data] [--compiled-batches LIST]
#                                 [--config FILE] [--precision fp32|bf16] [--data DIR] [--build DIR] [--python PY]
#                                 [--trace-dir DIR] [--data-batches N] [--deadline S]
#
# Prints one JSON line per system and batch, with at least: system, batch, warmup_updates, timed_updates,
# sequences_per_s, model_flops_per_sequence, flops_6nt_per_sequence, mfu_model, mfu_6nt (null where the device's
# peak is unknown, e.g. a CPU), aten_ops_per_update, data_wait_ms, host_ms, device_ms, peak_memory_bytes; and one
# line {"system":"hetseq-data","sequences_per_s":N,...}. hetseq's figures come from its --step-profile W,T (Note
# [Step profile]); the peer measures the same way. FLOPs: benchmarks/bert_flops.py (formulas in
# docs/BENCHMARKS.md). A batch that does not fit (out of memory) prints {"system":..,"batch":..,"error":".."}.
#
# Systems: data (the hetseq-data line, once, at the largest batch), hetseq (hetseq-train), hetseq-graph (hetseq-train --cuda-graph: Note [CUDA-graph updates]; on a CPU
# it trains uncaptured, with padded batches), peer and peer-compiled (torch.compile, masked positions padded).
# --compiled-batches: the batches at which peer-compiled runs (default: all of --batches; compiling takes minutes).
# --deadline S: no run starts S seconds after the script did; those left print {"system":..,"error":"skipped..."}.
#
# Defaults: --device cpu: configs/bert-tiny.json, fp32, batches 16,32, one intra-op thread and one loader thread
# (this machine has two cores); --device cuda: configs/bert-base-uncased.json, bf16, batches 32,64,128,256,512.
# --warmup 20, --updates 100. --data: the BERT example's shards (scripts/bert_data.sh makes them when missing).
# --trace-dir DIR: hetseq also writes a Kineto trace of 5 updates after the timed span of its first batch
# (DIR/ops_rank0.json, and DIR/trace_rank0.json), for benchmarks/kineto_summary.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
DEVICE=cpu
BATCHES=""
WARMUP=20
UPDATES=100
SYSTEMS="hetseq,peer,peer-compiled,data"
CONFIG=""
PRECISION=""
DATA=""
BUILD="$ROOT/build"
PY="${HETSEQ_PYTHON:-$HETSEQ_HOME/venv-torch-2.11.0/bin/python}"
TRACE_DIR=""
DATA_BATCHES=2000
COMPILED_BATCHES=""
DEADLINE=0
START=$(date +%s)

die() { echo "bert_throughput: error: $*" >&2; exit 1; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --batches) BATCHES="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --updates) UPDATES="$2"; shift 2 ;;
    --systems) SYSTEMS="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --trace-dir) TRACE_DIR="$2"; shift 2 ;;
    --data-batches) DATA_BATCHES="$2"; shift 2 ;;
    --compiled-batches) COMPILED_BATCHES="$2"; shift 2 ;;
    --deadline) DEADLINE="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$DEVICE" in
  cpu) : "${CONFIG:=$ROOT/configs/bert-tiny.json}" "${PRECISION:=fp32}" "${BATCHES:=16,32}"
       THREADS=1; LOADERS=1; DEVICE_FLAGS=(--cpu) ;;
  cuda) : "${CONFIG:=$ROOT/configs/bert-base-uncased.json}" "${PRECISION:=bf16}" "${BATCHES:=32,64,128,256,512}"
        THREADS=0; LOADERS=4; DEVICE_FLAGS=(--device-id 0) ;;
  *) die "--device: '$DEVICE' is not cpu or cuda" ;;
esac
case "$PRECISION" in
  fp32) PRECISION_FLAGS=() ;;
  bf16) PRECISION_FLAGS=(--bf16) ;;
  *) die "--precision: '$PRECISION' is not fp32 or bf16" ;;
esac
TRAIN="$BUILD/bin/hetseq-train"
[ -x "$TRAIN" ] || die "$TRAIN not found; build first (scripts/build.sh)"
[ -x "$PY" ] || die "no Python at $PY (scripts/setup.sh makes it; or --python)"
if [ -z "$DATA" ]; then
  DATA="$(HETSEQ_PYTHON="$PY" bash "$ROOT/scripts/bert_data.sh")" || die "scripts/bert_data.sh could not make the data"
fi
ls "$DATA"/*train*.hdf5 >/dev/null 2>&1 || die "--data $DATA has no train shards"
[ "$DEVICE" = cpu ] && export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bert_throughput.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# emit SYSTEM BATCH FILE: the figures of FILE (hetseq's step_profile and train_epoch lines, or the peer's line) as
# one JSON line with the FLOP counts and MFU of bert_flops.py.
emit() {
  "$PY" - "$1" "$2" "$3" "$CONFIG" "$DEVICE" "$PRECISION" "$ROOT/benchmarks" <<'PYEOF'
import json, sys
system, batch, path, config_path, device, precision, benchmarks = sys.argv[1:8]
sys.path.insert(0, benchmarks)
import bert_flops
rows = [json.loads(l) for l in open(path) if l.startswith("{")]
config = json.load(open(config_path))
if system.startswith("hetseq"):
    prof = [r for r in rows if r.get("tag") == "step_profile"][-1]
    epoch = [r for r in rows if r.get("tag") in ("train_epoch", "train")][-1]
    out = {"system": system, "batch": int(batch), "workers": 1, "seq_length": 128,
           "warmup_updates": prof["warmup_updates"], "timed_updates": prof["timed_updates"],
           "sequences_per_s": prof["samples_per_s"],
           "masked_per_sequence": float(epoch["wpb"]) / float(epoch["bsz"]),
           "aten_ops_per_update": prof["aten_ops_per_update"],
           "aten_top_ops_per_update": prof.get("aten_top_ops_per_update"),
           "host_reads_per_update": prof["host_reads_per_update"],
           "data_wait_ms": prof["data_wait_ms"], "host_ms": prof["host_ms"], "device_ms": prof["device_ms"],
           "peak_memory_bytes": prof["peak_memory_bytes"], "peak_reserved_bytes": prof.get("peak_reserved_bytes"),
           "replayed_updates": prof.get("replayed_updates"), "final_loss": epoch.get("loss")}
    # A --cuda-graph run whose timed updates replayed no graph fell back to eager updates: not a graph figure.
    if system == "hetseq-graph" and not out["replayed_updates"]:
        out["system"] = "hetseq-graph-fallback"
else:
    out = dict(rows[-1])
    out["system"] = system
out["device"] = device
out["precision"] = precision
seq = int(out.get("seq_length", 128))
out["model_flops_per_sequence"] = bert_flops.model_flops_per_sequence(config, seq, out["masked_per_sequence"])
out["flops_6nt_per_sequence"] = bert_flops.flops_6nt_per_sequence(config, seq)
peak = None
if device == "cuda":
    import torch
    peak = bert_flops.peak_flops(torch.cuda.get_device_name(0), precision)
for key, per in (("mfu_model", "model_flops_per_sequence"), ("mfu_6nt", "flops_6nt_per_sequence")):
    out[key] = None if peak is None else out["sequences_per_s"] * out[per] / peak
print(json.dumps(out), flush=True)
PYEOF
}

failed() {  # failed SYSTEM BATCH LOG: a run that did not finish, as one JSON line
  "$PY" -c 'import json, sys; print(json.dumps({"system": sys.argv[1], "batch": int(sys.argv[2]), "error": sys.argv[3]}))' \
    "$1" "$2" "$(grep -m1 -io 'out of memory[^"]*' "$3" | head -c 200 || tail -n 1 "$3" | head -c 200)"
}

first=1
IFS=, read -r -a batch_list <<<"$BATCHES"
IFS=, read -r -a system_list <<<"$SYSTEMS"
: "${COMPILED_BATCHES:=$BATCHES}"
for batch in "${batch_list[@]}"; do
  for system in "${system_list[@]}"; do
    [ "$system" = data ] && continue
    if [ "$system" = peer-compiled ] && [[ ",$COMPILED_BATCHES," != *",$batch,"* ]]; then continue; fi
    if [ "$DEADLINE" -gt 0 ] && [ $(( $(date +%s) - START )) -ge "$DEADLINE" ]; then
      "$PY" -c 'import json, sys; print(json.dumps({"system": sys.argv[1], "batch": int(sys.argv[2]), "error": "skipped: past --deadline"}))' "$system" "$batch"
      continue
    fi
    case "$system" in
      hetseq|hetseq-graph)
        trace=()
        graph=()
        [ "$system" = hetseq-graph ] && graph=(--cuda-graph)
        total=$((WARMUP + UPDATES))
        # The trace (and its operator records) covers 5 updates after the timed span, never inside it: its
        # tracer synchronises per update and boxes every operator's inputs.
        if [ -n "$TRACE_DIR" ] && [ "$first" = 1 ] && [ "$system" = hetseq ]; then
          trace=(--trace-dir "$TRACE_DIR" --trace-updates "$((total + 1)):$((total + 5))" --trace-ops)
          total=$((total + 5))
        fi
        threads=()
        [ "$THREADS" -gt 0 ] && threads=(--intra-op-threads "$THREADS")
        if "$TRAIN" --task bert --data "$DATA" --config_file "$CONFIG" "${DEVICE_FLAGS[@]}" --max-sentences "$batch" \
             --max-update "$total" --step-profile "$WARMUP,$UPDATES" --optimizer adam --lr 1e-4 \
             --weight-decay 0.01 --clip-norm 1.0 --lr_scheduler fixed --max_pred_length 20 --disable-validation \
             --no-save --log-format json --log-interval 1000000 --num-workers "$LOADERS" --no-progress-bar \
             "${threads[@]}" "${PRECISION_FLAGS[@]}" "${trace[@]}" "${graph[@]}" >"$WORK/out" 2>"$WORK/err"; then
          emit "$system" "$batch" "$WORK/out"
          [ "$system" = hetseq ] && first=0
          grep -h '\[cuda-graph\]' "$WORK/err" >&2 || true
        else
          failed "$system" "$batch" "$WORK/err"
        fi ;;
      peer|peer-compiled)
        compile=()
        [ "$system" = peer-compiled ] && compile=(--compile)
        if "$PY" "$ROOT/benchmarks/bert_python_peer.py" --data "$DATA" --config "$CONFIG" --device "$DEVICE" \
             --precision "$PRECISION" --batch-size "$batch" --warmup "$WARMUP" --updates "$UPDATES" \
             --lr 1e-4 --weight-decay 0.01 --clip-norm 1.0 \
             --threads "$([ "$THREADS" -gt 0 ] && echo "$THREADS" || nproc)" --loader-workers "$LOADERS" \
             "${compile[@]}" >"$WORK/out" 2>"$WORK/err"; then
          emit "$system" "$batch" "$WORK/out"
        else
          failed "$system" "$batch" "$WORK/err"
        fi ;;
      *) die "--systems: unknown system '$system' (hetseq, hetseq-graph, peer, peer-compiled, data)" ;;
    esac
  done
done
# The data path alone: one rank's collate and pinning at the largest batch of the sweep.
if [[ ",$SYSTEMS," == *",data,"* ]]; then
  DATA_BIN="$BUILD/bin/bert-data"
  [ -x "$DATA_BIN" ] || die "$DATA_BIN not found; build it (scripts/build.sh builds every target)"
  "$DATA_BIN" --data "$DATA" --batch "${batch_list[-1]}" --batches "$DATA_BATCHES" --workers 2 --ahead 8
fi
