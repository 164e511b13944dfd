#!/usr/bin/env bash
# --zero-sharding os, os+grad and full on BERT, 3 CPU ranks over Gloo (issues 27, 38): what each rank holds and how
# fast it trains, and the largest BERT that the memory check lets train under each mode when the ranks' budgets
# differ.
#
#   benchmarks/zero_memory.sh [--updates N] [--repeats R] [--batch B] [--layers L] [--hidden H]
#                             [--small-budget GB] [--big-budget GB] [--budgets "B0 B1 B2"]
#                             [--hiddens "H1 H2"] [--max-layers M] [--modes "full os+grad os none"]
#                             [--no-throughput] [--no-boundary] [--data DIR] [--build DIR] [--python PY]
#
# Part 1 (throughput and memory): BERT with L layers of width H (heads H/64, feed-forward 4H, the uncased
# vocabulary of 30522), Adam (weight decay 0.01, --clip-norm 1), B sequences of 128 tokens per rank, N updates,
# no validation, one intra-op thread per rank, three separate hetseq-train processes (file:// rendezvous). Three
# modes, run one after another within each repeat (their order rotating every repeat), R repeats:
#   none          --zero-sharding none (no budget, no memory check)
#   os 1:1:1      --zero-sharding os, --memory-budget 2 GB on every rank
#   os 1:1:2      --zero-sharding os, --memory-budget 1, 1, 2 GB
#   os+grad 1:1:2 --zero-sharding os+grad, --memory-budget 1, 1, 2 GB
#   full 1:1:2    --zero-sharding full, --memory-budget 1, 1, 2 GB
# For each rank: the parameter, optimizer state and gradient bytes it holds between updates (the `shard` JSON
# lines: read from the allocated tensors; under none the parameters' 4 bytes, Adam's 2 x 4 bytes and the
# gradient's 4 bytes per parameter), the peak RSS (/usr/bin/time's maximum resident set size) and the bytes the
# memory check says it needs; and the run's samples/s (ups x bsz of the train_epoch line: all ranks' sequences
# over the span from the first update's start to the last one's end). Prints every run, then the medians, the
# ratio of the medians os/none, and the median of each repeat's os/none ratio (runs side by side, less exposed to
# a load that changes between repeats).
#
# Part 2 (the largest BERT): budgets SMALL:BIG:BIG GB (default 0.5:2:2), or --budgets. For each mode in --modes
# and each width in --hiddens, the most
# layers (up to --max-layers) that pass the memory check (Note [Memory that a rank needs]), found by bisection
# with runs of 2 updates (a run that does not fit stops before training with exit code 3), with the same budgets
# under every mode; the largest by parameter count under each mode then trains 5 updates (reported as in part 1).
#
# Defaults: --updates 10, --repeats 3, --batch 4, --layers 2, --hidden 512, --small-budget 0.5, --big-budget 2,
# --hiddens "256 512", --max-layers 24, --data $HETSEQ_HOME/bert/jargon-128 (made by scripts/train_bert.sh),
# --build build, --python $HETSEQ_PYTHON or ~/.cache/hetseq/venv-torch-2.11.0/bin/python. About 6 minutes on
# 2 cores. See docs/BENCHMARKS.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/benchmarks/common.sh"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
UPDATES=10
REPEATS=3
BATCH=4
LAYERS=2
HIDDEN=512
SMALL=0.5
BIG=2
HIDDENS="256 512"
MAX_LAYERS=24
BUDGETS2=""
MODES="full os+grad os none"
THROUGHPUT=1
BOUNDARY=1
DATA="$HETSEQ_HOME/bert/jargon-128"
BUILD="$ROOT/build"
PY="${HETSEQ_PYTHON:-$HETSEQ_HOME/venv-torch-2.11.0/bin/python}"

while [ "$#" -gt 0 ]; do
  case "$1" in
    --updates) need_value "$@"; UPDATES="$2"; shift 2 ;;
    --repeats) need_value "$@"; REPEATS="$2"; shift 2 ;;
    --batch) need_value "$@"; BATCH="$2"; shift 2 ;;
    --layers) need_value "$@"; LAYERS="$2"; shift 2 ;;
    --hidden) need_value "$@"; HIDDEN="$2"; shift 2 ;;
    --small-budget) need_value "$@"; SMALL="$2"; shift 2 ;;
    --big-budget) need_value "$@"; BIG="$2"; shift 2 ;;
    --hiddens) need_value "$@"; HIDDENS="$2"; shift 2 ;;
    --max-layers) need_value "$@"; MAX_LAYERS="$2"; shift 2 ;;
    --budgets) need_value "$@"; BUDGETS2="$2"; shift 2 ;;
    --modes) need_value "$@"; MODES="$2"; shift 2 ;;
    --no-throughput) THROUGHPUT=0; shift ;;
    --no-boundary) BOUNDARY=0; shift ;;
    --data) need_value "$@"; DATA="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --python) need_value "$@"; PY="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
TRAIN="$BUILD/bin/hetseq-train"
[ -x "$TRAIN" ] || die "$TRAIN not found; build first (scripts/build.sh)"
[ -x /usr/bin/time ] || die "/usr/bin/time (GNU time) not found: it measures the peak RSS"
ls "$DATA"/*train*.hdf5 >/dev/null 2>&1 || die "--data $DATA has no train shards; run scripts/train_bert.sh once"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/zero_memory.XXXXXX")"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
# The runs use a copy of hetseq-train and libhetseq (found first through LD_LIBRARY_PATH, before the binary's
# RUNPATH), so that a rebuild while the benchmark runs changes nothing under it.
mkdir -p "$WORK/bin" "$WORK/lib"
cp "$TRAIN" "$WORK/bin/hetseq-train"
cp -L "$BUILD"/lib/libhetseq.so.* "$WORK/lib/"
TRAIN="$WORK/bin/hetseq-train"
export LD_LIBRARY_PATH="$WORK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

config() {  # config LAYERS HIDDEN -> a BERT config file
  local f="$WORK/bert-$1x$2.json"
  "$PY" -c '
import json, sys
layers, hidden = int(sys.argv[2]), int(sys.argv[3])
c = json.load(open(sys.argv[1]))
c.update(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=4 * hidden,
         num_attention_heads=max(1, hidden // 64))
json.dump(c, open(sys.argv[4], "w"))' "$ROOT/configs/bert-tiny.json" "$1" "$2" "$f"
  echo "$f"
}

# run TAG CONFIG SHARDING UPDATES BUDGET0 BUDGET1 BUDGET2 (a budget "-": none given): sets RUN_CODE to rank 0's
# exit code; the ranks' stdout, stderr and peak RSS (KB) are in $WORK/TAG.{out,err,rss}.RANK
run() {
  local tag="$1" cfg="$2" sharding="$3" updates="$4"; shift 4
  local budgets=("$@") r codes=()
  PIDS=()
  for r in 0 1 2; do
    local extra=()
    [ "${budgets[$r]}" != - ] && extra=(--memory-budget "${budgets[$r]}")
    /usr/bin/time -f '%M' -o "$WORK/$tag.rss.$r" "$TRAIN" --task bert --data "$DATA" --config_file "$cfg" --cpu \
      --distributed-world-size 3 --distributed-rank "$r" --distributed-init-method "file://$WORK/$tag.rendezvous" \
      --distributed-timeout 120 --max-sentences "$BATCH" --max-update "$updates" --optimizer adam --lr 0.001 \
      --weight-decay 0.01 --clip-norm 1.0 --lr_scheduler fixed --disable-validation --no-save --log-format json \
      --log-interval 1000000 --intra-op-threads 1 --num-workers 1 --no-progress-bar --zero-sharding "$sharding" \
      "${extra[@]}" >"$WORK/$tag.out.$r" 2>"$WORK/$tag.err.$r" &
    PIDS+=("$!")
  done
  for r in 0 1 2; do
    if wait "${PIDS[$r]}"; then codes+=(0); else codes+=("$?"); fi
  done
  PIDS=()
  RUN_CODE="${codes[0]}"
}

# report TAG SHARDING -> one line of figures per rank and a summary line (samples/s), as key=value words
report() {
  "$PY" - "$WORK" "$1" "$2" <<'PYEOF'
import json, re, sys
work, tag, sharding = sys.argv[1:4]
def lines(r):
    return [json.loads(l) for l in open(f"{work}/{tag}.out.{r}") if l.startswith("{")]
rows = lines(0)
epoch = [x for x in rows if x.get("tag") == "train_epoch"][-1]
shards = {x["rank"]: x["state_bytes"] for x in rows if x.get("tag") == "shard"}
grads = {x["rank"]: x["grad_bytes"] for x in rows if x.get("tag") == "shard"}
held = {x["rank"]: x["param_bytes"] for x in rows if x.get("tag") == "shard"}
err = open(f"{work}/{tag}.err.0").read()
params = int(re.search(r"model with (\d+) parameters", err).group(1))
needs = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"\[memory\] rank (\d+): needs ([\d.]+) MB", err)}
for r in range(3):
    rss = int(open(f"{work}/{tag}.rss.{r}").read().split()[-1]) * 1024
    state = shards.get(r, 8 * params if sharding == "none" else -1)
    need = "%.1f" % needs[r] if r in needs else "-"
    grad = grads.get(r, 4 * params if sharding == "none" else -1)
    param = held.get(r, 4 * params if sharding == "none" else -1)
    print(f"rank={r} param_mb={param / 1e6:.1f} state_mb={state / 1e6:.1f} grad_mb={grad / 1e6:.1f} "
          f"rss_mb={rss / 1e6:.1f} need_mb={need}")
print(f"samples_s={float(epoch['ups']) * float(epoch['bsz']):.3f} updates={epoch['num_updates']} params={params}")
PYEOF
}

field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p"; }  # field KEY < line -> value
median() { "$PY" -c 'import statistics, sys; print("%.3f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }
median_mb() { "$PY" -c 'import statistics, sys; print("%.1f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }

echo "zero_memory: $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $BUILD/bin/hetseq-train" \
  "(commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
if [ "$THROUGHPUT" = 1 ]; then
  CFG="$(config "$LAYERS" "$HIDDEN")"
  echo "part 1: BERT $LAYERS layers x $HIDDEN, Adam, $BATCH sequences of 128 tokens per rank, $UPDATES updates, 3 ranks"
  NAMES=(none os-1:1:1 os-1:1:2 os+grad-1:1:2 full-1:1:2)  # [mode]
  SHARDINGS=(none os os os+grad full)
  BUDGETS=("- - -" "2 2 2" "1 1 2" "1 1 2" "1 1 2")
  MODE_COUNT=${#NAMES[@]}
  declare -A SPS PARAM STATE GRAD RSS NEED REP_SPS
  for ((rep = 1; rep <= REPEATS; rep++)); do
    for ((k = 0; k < MODE_COUNT; k++)); do
      i=$(((k + rep - 1) % MODE_COUNT))
      name="${NAMES[$i]}"; sharding="${SHARDINGS[$i]}"
      tag="$(echo "$name" | tr ':+' '_p').$rep"
      load="$(load1)"
      # shellcheck disable=SC2086
      run "$tag" "$CFG" "$sharding" "$UPDATES" ${BUDGETS[$i]}
      [ "$RUN_CODE" = 0 ] || { tail -n 3 "$WORK/$tag.err.0" >&2; die "$name run $rep failed (exit code $RUN_CODE)"; }
      out="$(report "$tag" "$sharding")"
      sps="$(echo "$out" | tail -n 1 | field samples_s)"
      SPS[$name]+="$sps "
      REP_SPS[$name.$rep]="$sps"
      printf '  run %d  %-9s %8s samples/s  (load before %s)\n' "$rep" "$name" "$sps" "$load"
      for r in 0 1 2; do
        line="$(echo "$out" | sed -n "$((r + 1))p")"
        PARAM[$name.$r]+="$(echo "$line" | field param_mb) "
        STATE[$name.$r]+="$(echo "$line" | field state_mb) "
        GRAD[$name.$r]+="$(echo "$line" | field grad_mb) "
        RSS[$name.$r]+="$(echo "$line" | field rss_mb) "
        NEED[$name.$r]+="$(echo "$line" | field need_mb) "
        echo "      $line"
      done
    done
  done
  echo "medians of $REPEATS runs (MB = 10^6 bytes):"
  for name in "${NAMES[@]}"; do
    printf '  %-9s %s samples/s' "$name" "$(median ${SPS[$name]})"
    for r in 0 1 2; do
      need="$(echo ${NEED[$name.$r]} | cut -d' ' -f1)"
      printf ' | rank %d: parameters %s MB, state %s MB, gradients %s MB, peak RSS %s MB, check %s MB' "$r" \
        "$(median_mb ${PARAM[$name.$r]})" "$(median_mb ${STATE[$name.$r]})" "$(median_mb ${GRAD[$name.$r]})" "$(median_mb ${RSS[$name.$r]})" "$need"
    done
    echo
  done
  base="$(median ${SPS[none]})"
  for name in "${NAMES[@]:1}"; do
    ratios=()
    for ((rep = 1; rep <= REPEATS; rep++)); do
      ratios+=("$("$PY" -c "print('%.3f' % (${REP_SPS[$name.$rep]} / ${REP_SPS[none.$rep]}))")")
    done
    echo "  samples/s $name / none: $("$PY" -c "print('%.3f' % ($(median ${SPS[$name]}) / $base))") (medians);" \
      "per repeat ${ratios[*]}, median $(median "${ratios[@]}")"
  done
fi

if [ "$BOUNDARY" = 1 ]; then
  read -r -a B2 <<<"${BUDGETS2:-$SMALL $BIG $BIG}"
  [ "${#B2[@]}" = 3 ] || die "--budgets wants three values, one per rank"
  echo "part 2: the most layers that pass the memory check with budgets ${B2[0]}:${B2[1]}:${B2[2]} GB ($BATCH sequences per rank)"
  declare -A BEST_PARAMS BEST_NAME
  fits() {  # fits SHARDING LAYERS HIDDEN: status 0 when the run (2 updates) passes the check and trains,
            # with its parameter count in FIT_PARAMS
    local tag="probe-$1-$2x$3"
    run "$tag" "$(config "$2" "$3")" "$1" 2 "${B2[@]}"
    FIT_PARAMS="$(sed -n 's/.*model with \([0-9]*\) parameters.*/\1/p' "$WORK/$tag.err.0" | head -n 1)"
    if [ "$RUN_CODE" = 0 ]; then
      local need; need="$(sed -n 's/.*\[memory\] rank 0: needs \([0-9.]*\) MB of its \([0-9.]*\) MB.*/\1 of \2/p' "$WORK/$tag.err.0")"
      echo "    $1 $2 x $3 ($FIT_PARAMS parameters): fits, rank 0 needs $need MB"
      return 0
    fi
    [ "$RUN_CODE" = 3 ] || { tail -n 3 "$WORK/$tag.err.0" >&2; die "$1 $2 x $3 failed with exit code $RUN_CODE"; }
    echo "    $1 $2 x $3 ($FIT_PARAMS parameters): does not fit: $(grep -o 'rank [0-9]* needs [0-9]* bytes but has [0-9]* bytes' "$WORK/$tag.err.0" | head -n 1)"
    return 1
  }
  for sharding in $MODES; do
    for h in $HIDDENS; do
      lo=0; hi=$((MAX_LAYERS + 1)); lo_params=0  # lo fits (0: none tried fits), hi does not
      while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if fits "$sharding" "$mid" "$h"; then lo=$mid; lo_params=$FIT_PARAMS; else hi=$mid; fi
      done
      echo "  $sharding, hidden $h: at most $lo layers ($lo_params parameters)"
      if [ "$lo" -gt 0 ] && [ "$lo_params" -gt "${BEST_PARAMS[$sharding]:-0}" ]; then
        BEST_PARAMS[$sharding]=$lo_params; BEST_NAME[$sharding]="$lo $h"
      fi
    done
    if [ -n "${BEST_NAME[$sharding]:-}" ]; then
      read -r l h <<<"${BEST_NAME[$sharding]}"
      tag="final-$sharding"
      run "$tag" "$(config "$l" "$h")" "$sharding" 5 "${B2[@]}"
      [ "$RUN_CODE" = 0 ] || die "the largest $sharding BERT ($l x $h) failed to train (exit code $RUN_CODE)"
      echo "  largest under $sharding: $l layers x $h (${BEST_PARAMS[$sharding]} parameters), trained 5 updates:"
      report "$tag" "$sharding" | sed 's/^/      /'
    fi
  done
fi
echo "zero_memory: load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
