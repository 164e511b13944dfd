#!/usr/bin/env bash
# Automatic balancing (hetseq-train --auto-balance) on this machine's CPUs: MNIST training with ranks of
# unequal speed, against static splits, the equal split and PyTorch's Python DistributedDataParallel
# (benchmarks/mnist_python_ddp_peer.py), case by case, the variants of a case alternating.
#
#   benchmarks/balance.sh [--cases LIST] [--repeats R] [--updates N] [--changing-updates N] [--load A,B]
#                         [--build DIR] [--python PY] [--data DIR] [--quiet-wait S] [--timeout S]
#                         [--plot PNG] [--out DIR]
#
# Cases (name: ranks pinned to CPUs with taskset, samples per update):
#   static:    3 ranks on CPUs 0,0,1 (ranks 0 and 1 share CPU 0), 192 samples per update. Variants: the
#              static splits (rank 0/1/2 batches) 64/64/64 (the equal split), 56/56/80, 48/48/96,
#              40/40/112 and 32/32/128; --auto-balance starting from 64/64/64; the Python peer with
#              64/64/64. Reports the best static split, auto / best static (target >= 0.95), auto / equal
#              (target >= 1.25), and the update after which the auto run settled: the last
#              "[balance] update N: split [..] -> [..]" line of rank 0 that moves more than 5% of the 192
#              samples in some rank (0: never moved that much), with the final split.
#   changing:  2 ranks on CPUs 0 and 1, 64+64 samples per update, --changing-updates updates (default
#              400, 45-60 s a run here). From A to B seconds after rank 0's first update (--load,
#              default 15,32; scaled with --changing-updates when not given) a busy loop pinned to CPU 1
#              (`taskset -c 1 bash -c 'while :; do :; done'`) takes half of rank 1's CPU. Variants: equal
#              64,64; --auto-balance from 64,64; the Python peer with 64,64. hetseq runs with
#              --log-interval 1 and rank 0's stdout is timestamped line by line as it arrives (a small
#              Python reader on rank 0's CPU), so each phase (before, during, after the load) gets its
#              samples/s: the samples of the updates that began and ended inside the phase over their
#              time. Targets: auto >= 1.2 x equal during the load, auto within 3% of equal after it.
#              The peer reports no per-update timing, only its samples/s over its whole run: its load
#              is placed by its launch time plus its previous run's start-up time (for the first, that
#              of a run of 2 updates before the case), and the window it actually got, relative to its
#              timed span, is printed.
#              After the case, --plot PNG (default docs/balance_changing_load.png) shows one auto run
#              and the equal run of the same repeat (benchmarks/plot_balance.py; the repeat whose auto
#              samples/s during the load is the median). It needs matplotlib in PY.
#   overhead:  2 ranks on CPUs 0 and 1, 64+64: equal against --auto-balance (default --balance-interval
#              10), which should find nothing to move. Target: auto costs <= 2% of samples/s.
# Every rank is its own process with one intra-op thread (OMP_NUM_THREADS=MKL_NUM_THREADS=1), started with
# `taskset -c CPU`, as users start one node each (`--distributed-no-spawn --distributed-rank r`), over a
# fresh file:// rendezvous and Gloo on loopback; Adam lr 0.001, all updates within the first epoch. A
# hetseq run's figure is the global samples/s (all ranks) from its first update to the end of its last:
# `wps` of rank 0's train_epoch JSON line, printed with its `balance_eff` (measured samples/s over what
# the ranks' compute speeds allow); the peer's is its own timing of the same span on rank 0. Per repeat
# the variants of a case run in turn, in reverse order every other repeat, R times each (default 3); the
# script prints every run and the medians. --updates N: updates per run of static and overhead (default
# 300; static allows at most 312, the others 468: full updates in one epoch of 60000 samples).
# --cases: comma list of case names (default all). --quiet-wait S: before each run wait up to S seconds
# for an idle machine (see mnist_throughput.sh). --timeout S: a run that takes longer is killed and the
# benchmark fails (default 300). --out DIR keeps every run's output there (default: a temporary directory,
# removed at exit). Relative --build, --plot and --out are taken from the repository root. "cpu%" is the
# whole machine's CPU use during the run (100 = both CPUs; the changing case's busy loop counts).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
CASES="static,changing,overhead"
REPEATS=3
UPDATES=300
CHANGING_UPDATES=400
LOAD=""
BUILD="build"
PY="${HETSEQ_PYTHON:-$HOME/.cache/hetseq/venv-torch-2.11.0/bin/python}"
DATA="/usr/share/datasets/fashion-mnist"
QUIET_WAIT=0
TIMEOUT=300
PLOT="docs/balance_changing_load.png"
OUT=""
SEED=1

while [ "$#" -gt 0 ]; do
  case "$1" in
    --cases) need_value "$@"; CASES="$2"; shift 2 ;;
    --repeats) need_value "$@"; REPEATS="$2"; shift 2 ;;
    --updates) need_value "$@"; UPDATES="$2"; shift 2 ;;
    --changing-updates) need_value "$@"; CHANGING_UPDATES="$2"; shift 2 ;;
    --load) need_value "$@"; LOAD="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --python) need_value "$@"; PY="$2"; shift 2 ;;
    --data) need_value "$@"; DATA="$2"; shift 2 ;;
    --quiet-wait) need_value "$@"; QUIET_WAIT="$2"; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
    --plot) need_value "$@"; PLOT="$2"; shift 2 ;;
    --out) need_value "$@"; OUT="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_seconds() { [[ "$1" =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
{ is_uint "$REPEATS" && [ "$REPEATS" -ge 1 ]; } || die "--repeats: '$REPEATS' is not a positive integer"
is_uint "$QUIET_WAIT" || die "--quiet-wait: '$QUIET_WAIT' is not a number of seconds"
{ is_uint "$TIMEOUT" && [ "$TIMEOUT" -ge 1 ]; } || die "--timeout: '$TIMEOUT' is not a positive number of seconds"
IFS=, read -r -a CASE_LIST <<<"$CASES"
[ "${#CASE_LIST[@]}" -ge 1 ] || die "--cases: empty list (static, changing, overhead)"
for c in "${CASE_LIST[@]}"; do
  case "$c" in static|changing|overhead) ;; *) die "--cases: unknown case '$c' (static, changing, overhead)" ;; esac
done
has_case() { [[ ",$CASES," == *",$1,"* ]]; }
if has_case static; then
  { is_uint "$UPDATES" && [ "$UPDATES" -ge 1 ] && [ "$UPDATES" -le 312 ]; } ||
    die "--updates: '$UPDATES' is not in 1..312 (the full updates of 192 samples in one epoch of 60000)"
else
  { is_uint "$UPDATES" && [ "$UPDATES" -ge 1 ] && [ "$UPDATES" -le 468 ]; } ||
    die "--updates: '$UPDATES' is not in 1..468 (the full updates of 128 samples in one epoch of 60000)"
fi
{ is_uint "$CHANGING_UPDATES" && [ "$CHANGING_UPDATES" -ge 2 ] && [ "$CHANGING_UPDATES" -le 468 ]; } ||
  die "--changing-updates: '$CHANGING_UPDATES' is not in 2..468 (the full updates of 128 samples in one epoch)"
if [ -z "$LOAD" ]; then  # the default window, for 400 updates, scaled to the updates asked for
  LOAD="$(awk -v n="$CHANGING_UPDATES" 'BEGIN { printf "%.1f,%.1f", 15 * n / 400, 32 * n / 400 }')"
fi
IFS=, read -r LOAD_A LOAD_B LOAD_REST <<<"$LOAD,"
{ is_seconds "$LOAD_A" && is_seconds "$LOAD_B" && [ -z "${LOAD_REST%,}" ]; } ||
  die "--load: '$LOAD' is not two numbers of seconds A,B"
LOAD_A_MS="$(awk -v s="$LOAD_A" 'BEGIN { printf "%.0f", 1000 * s }')"
LOAD_B_MS="$(awk -v s="$LOAD_B" 'BEGIN { printf "%.0f", 1000 * s }')"
[ "$LOAD_B_MS" -gt "$LOAD_A_MS" ] || die "--load: the end $LOAD_B s is not after the start $LOAD_A s"

case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
case "$PLOT" in /*) ;; *) PLOT="$ROOT/$PLOT" ;; esac
TRAIN="$BUILD/bin/hetseq-train"
PEER="$ROOT/benchmarks/mnist_python_ddp_peer.py"
PLOTTER="$ROOT/benchmarks/plot_balance.py"
[ -x "$TRAIN" ] || die "$TRAIN not found or not executable; build it first: ninja -C $BUILD hetseq-train"
"$TRAIN" --help 2>/dev/null | grep -q -- '--auto-balance' ||
  die "$TRAIN has no --auto-balance flag; rebuild it: ninja -C $BUILD hetseq-train"
[ -x "$PY" ] || die "python '$PY' not found; pass --python or set HETSEQ_PYTHON (scripts/setup.sh makes the venv)"
TORCH_VERSION="$("$PY" -c 'import torch, numpy; print(torch.__version__)' 2>/dev/null)" ||
  die "'$PY' cannot import torch and numpy; use the venv scripts/setup.sh makes"
if has_case changing; then
  "$PY" -c 'import matplotlib' 2>/dev/null ||
    die "'$PY' cannot import matplotlib, which the changing case's plot needs: $PY -m pip install matplotlib"
  [ -d "$(dirname "$PLOT")" ] || die "--plot $PLOT: no directory $(dirname "$PLOT")"
fi
[ -d "$DATA" ] || die "--data $DATA: no such directory (apt-get install dataset-fashion-mnist)"
command -v taskset >/dev/null 2>&1 || die "taskset not found (apt-get install util-linux)"
[ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ] || die "the cases pin ranks to CPUs 0 and 1; this machine has one CPU"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

if [ -n "$OUT" ]; then
  case "$OUT" in /*) ;; *) OUT="$ROOT/$OUT" ;; esac
  mkdir -p "$OUT" || die "--out $OUT: cannot create the directory"
  WORK="$OUT"
else
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/balance.XXXXXX")"
fi
RDV_DIR="$(mktemp -d "${TMPDIR:-/tmp}/balance_rdv.XXXXXX")"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$RDV_DIR"
  if [ -z "$OUT" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
TRAIN_ID="$(fingerprint "$TRAIN")"
RUN=0
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
now_ms() { date +%s%3N; }
LAUNCH_MS=0        # when the last run's ranks were started
PEER_DELAY_MS=0    # the peer's start-up before its first update (changing case), measured

# Prefixes each line of stdin with the time it arrived (Unix seconds), flushing each line.
READER='import sys, time
for line in iter(sys.stdin.readline, ""):
    sys.stdout.write(f"{time.time():.6f} {line}")
    sys.stdout.flush()'

# The command of one rank: rank_command IMPL WORLD RANK "BATCHES" RDV UPDATES LOG_INTERVAL "FLAGS".
rank_command() {
  local impl="$1" world="$2" r="$3" rdv="$5" updates="$6" interval="$7" flags="$8" batches
  read -r -a batches <<<"$4"
  if [ "$impl" = hetseq ]; then
    echo "$TRAIN --task mnist --data $DATA --max-sentences ${batches[$r]} --optimizer adam --lr 0.001"
    echo "--max-update $updates --seed $SEED --cpu --no-save --disable-validation --log-format json"
    echo "--log-interval $interval --num-workers 0 --intra-op-threads 1 --no-progress-bar --clip-norm 0"
    echo "--distributed-no-spawn --distributed-world-size $world --distributed-rank $r"
    echo "--distributed-init-method file://$rdv --distributed-timeout 120 $flags"
  else
    local list
    list="$(IFS=,; echo "${batches[*]}")"
    echo "$PY $PEER --data $DATA --init-method file://$rdv --world-size $world --rank $r"
    echo "--batch-sizes $list --max-update $updates --threads 1 --seed $SEED"
  fi
}

kill_all() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }

# The busy loop on CPU 1 of the changing case: load_on starts it, load_off kills it by its PID; the times
# (Unix ms) in LOAD_START_MS and LOAD_STOP_MS.
LOAD_PID=""
load_on() {
  taskset -c 1 bash -c 'while :; do :; done' &
  LOAD_PID="$!"
  PIDS+=("$LOAD_PID")
  LOAD_START_MS="$(now_ms)"
}
load_off() {
  [ -n "$LOAD_PID" ] || return 0
  kill -9 "$LOAD_PID" 2>/dev/null || true
  wait "$LOAD_PID" 2>/dev/null || true
  LOAD_PID=""
  LOAD_STOP_MS="$(now_ms)"
}

# run_ranks NAME IMPL "CPUS" "BATCHES" UPDATES LOG_INTERVAL "FLAGS" STAMP LOADED
# Starts one process per rank on its CPU, waits for all with a deadline, and kills stragglers. Output of
# rank r in $WORK/NAME.r.{out,err}. STAMP=1: rank 0's stdout is timestamped line by line (a reader on
# rank 0's CPU). LOADED=1: the busy loop runs on CPU 1 from LOAD_A to LOAD_B seconds after rank 0's first
# update (hetseq, seen in the timestamped stdout), or after the launch plus PEER_DELAY_MS (the peer,
# which prints nothing before it ends); the times it actually ran go to $WORK/NAME.load.
run_ranks() {
  local name="$1" impl="$2" updates="$5" interval="$6" flags="$7" stamp="$8" loaded="$9"
  local cpus batches world r rc deadline fifo="" reader="" t0="" now running first
  read -r -a cpus <<<"$3"
  read -r -a batches <<<"$4"
  world="${#cpus[@]}"
  RUN=$((RUN + 1))
  local rdv="$RDV_DIR/rdv.$RUN"
  PIDS=()
  LOAD_PID=""; LOAD_START_MS=""; LOAD_STOP_MS=""
  rm -f "$WORK/$name".*
  if [ "$stamp" = 1 ]; then
    fifo="$RDV_DIR/stdout.$RUN"
    mkfifo "$fifo"
    taskset -c "${cpus[0]}" "$PY" -c "$READER" <"$fifo" >"$WORK/$name.0.out" &
    reader="$!"
    PIDS+=("$reader")
  fi
  LAUNCH_MS="$(now_ms)"
  for ((r = 0; r < world; r++)); do
    local out="$WORK/$name.$r.out"
    [ "$r" -eq 0 ] && [ -n "$fifo" ] && out="$fifo"
    # shellcheck disable=SC2046
    taskset -c "${cpus[$r]}" $(rank_command "$impl" "$world" "$r" "${batches[*]}" "$rdv" "$updates" \
      "$interval" "$flags") >"$out" 2>"$WORK/$name.$r.err" &
    PIDS+=("$!")
  done
  if [ "$impl" = python ] && [ "$loaded" = 1 ]; then t0=$((LAUNCH_MS + PEER_DELAY_MS)); fi
  first=$((${#PIDS[@]} - world))
  deadline=$(($(date +%s) + TIMEOUT))
  local done_rank=()
  while :; do
    if [ "$loaded" = 1 ]; then
      if [ -z "$t0" ]; then
        local line
        line="$(grep -m1 '"tag":"train"' "$WORK/$name.0.out" 2>/dev/null || true)"
        [ -z "$line" ] || t0="$(awk -v s="${line%% *}" 'BEGIN { printf "%.0f", 1000 * s }')"
      fi
      now="$(now_ms)"
      if [ -n "$t0" ] && [ -z "$LOAD_START_MS" ] && [ "$now" -ge $((t0 + LOAD_A_MS)) ]; then load_on; fi
      if [ -n "$LOAD_PID" ] && [ "$now" -ge $((t0 + LOAD_B_MS)) ]; then load_off; fi
    fi
    running=0
    for ((r = 0; r < world; r++)); do
      [ -z "${done_rank[$r]:-}" ] || continue
      if kill -0 "${PIDS[$((first + r))]}" 2>/dev/null; then running=1; continue; fi
      rc=0
      wait "${PIDS[$((first + r))]}" || rc=$?
      done_rank[r]=1
      if [ "$rc" -ne 0 ]; then
        kill_all
        tail -n 20 "$WORK/$name.$r.err" >&2
        die "$name: rank $r exited with status $rc (the end of its stderr is above)"
      fi
    done
    [ "$running" = 1 ] || break
    if [ "$(date +%s)" -ge "$deadline" ]; then
      kill_all
      tail -n 20 "$WORK/$name.0.err" >&2
      die "$name: ranks still running after --timeout $TIMEOUT s; killed all ranks"
    fi
    sleep 0.2
  done
  if [ -n "$reader" ]; then wait "$reader" || die "$name: the timestamping reader of rank 0's stdout failed"; fi
  if [ "$loaded" = 1 ]; then
    [ -n "$LOAD_START_MS" ] || die "$name: the run ended before the load's start, $LOAD_A s after its first update;" \
      "lower --load or raise --changing-updates"
    [ -z "$LOAD_PID" ] || { load_off; echo "# $name: the run ended before the load's end (--load $LOAD)" >&2; }
    echo "$LOAD_START_MS $LOAD_STOP_MS" | awk '{ printf "%.3f %.3f\n", $1 / 1000, $2 / 1000 }' >"$WORK/$name.load"
  fi
  rm -f "$rdv" "$fifo"
  PIDS=()
}

# analyse NAME CASE VARIANT REPEAT IMPL UPDATES SAMPLES LAUNCH_MS: checks the run, appends its figures to
# $RESULTS as one JSON line and prints the rest of its row (after samples/s and balance_eff).
analyse() {
  "$PY" - "$WORK" "$RESULTS" "$@" <<'PYEOF' || die "$1: no usable figures in $WORK/$1.0.out (see its .err)"
import json, os, re, sys
work, results, name, case, variant, repeat, impl, updates, samples, launch_ms = sys.argv[1:]
updates, samples, repeat = int(updates), int(samples), int(repeat)
path = lambda ext: os.path.join(work, f"{name}.{ext}")

def rows(p):  # JSON lines of a stdout, each with its arrival time when timestamped
    out = []
    for line in open(p):
        t, _, rest = line.partition(" ")
        try:
            stamp = float(t)
        except ValueError:
            stamp, rest = None, line
        if rest.strip().startswith("{"):
            j = json.loads(rest)
            j["_t"] = stamp
            out.append(j)
    return out

rec = {"name": name, "case": case, "variant": variant, "repeat": repeat, "impl": impl}
load = None
if os.path.exists(path("load")):
    load = [float(v) for v in open(path("load")).read().split()]
    rec["load"] = load
lines = rows(path("0.out"))
if impl == "python":
    if len(lines) != 1:
        sys.exit(f"expected one result line, got {len(lines)}")
    r = lines[0]
    if int(r["updates"]) != updates:
        sys.exit(f"ran {r['updates']} updates, asked for {updates}")
    rec["samples_per_s"] = float(r["samples_per_s"])
    extra = ""
    if r["_t"] is not None:  # the timed span's start, from the time of its only line
        start = r["_t"] - float(r["seconds"])
        rec["delay_ms"] = round(1000 * start - float(launch_ms))
        if load:
            extra = f"load at {load[0] - start:.1f}-{load[1] - start:.1f} s of its {r['seconds']:.1f} s"
    print(f"{rec['samples_per_s']:10.1f} {'-':>5}\n{extra}")
else:
    epoch = [r for r in lines if r.get("tag") == "train_epoch"]
    if len(epoch) != 1:
        sys.exit(f"expected one train_epoch line, got {len(epoch)}")
    e = epoch[0]
    if int(e["num_updates"]) != updates:
        sys.exit(f"ran {e['num_updates']} updates, asked for {updates}")
    rec["samples_per_s"] = float(e["wps"])
    rec["balance_eff"] = e.get("balance_eff")
    # The balancer's changes on rank 0's stderr; the settling update is the last one that moves more than
    # 5% of the update's samples in some rank.
    err = open(path("0.err")).read()
    change = re.compile(r"\[balance\] update (\d+): split \[([0-9,]+)\] -> \[([0-9,]+)\]")
    settle, final = 0, None
    for m in change.finditer(err):
        old = [int(v) for v in m.group(2).split(",")]
        new = [int(v) for v in m.group(3).split(",")]
        final = new
        if max(abs(a - b) for a, b in zip(old, new)) > 0.05 * samples:
            settle = int(m.group(1))
    # The split of the last update, from the balancer's epoch line; a re-plan at the last update is
    # shown beside it (planned, never run).
    planned = final
    ends = re.findall(r"\[balance\] epoch \d+:.*? split \[([0-9,]+)\]", err)
    if ends:
        final = [int(v) for v in ends[-1].split(",")]
    rec["changes"] = len(change.findall(err))
    rec["settle"] = settle
    rec["final_split"] = final
    show = lambda split: ",".join(map(str, split))
    if final and planned and planned != final:
        final = f"{show(final)} (re-planned {show(planned)} at the last update)"
    else:
        final = show(final) if final else "unchanged"
    extra = ""
    if "auto" in variant:
        extra = f"settled at update {settle}, {rec['changes']} change(s), final split {final}"
    train = [r for r in lines if r.get("tag") == "train" and r["_t"] is not None]
    if load and train:  # samples/s per phase, from the updates that began and ended inside it
        if len(train) != updates:
            sys.exit(f"{len(train)} timestamped train lines for {updates} updates (--log-interval 1?)")
        bounds = {"before": (train[0]["_t"], load[0]), "during": (load[0], load[1]),
                  "after": (load[1], train[-1]["_t"])}
        phases = {}
        for phase, (a, b) in bounds.items():
            n = s = 0
            span = 0.0
            for prev, cur in zip(train, train[1:]):
                if prev["_t"] >= a and cur["_t"] <= b:
                    n += 1
                    s += sum(cur.get("split", [samples]))
                    span += cur["_t"] - prev["_t"]
            phases[phase] = {"updates": n, "samples_per_s": s / span if n >= 5 and span > 0 else None}
        rec["phases"] = phases
        shown = []
        for phase, v in phases.items():
            f = f"{v['samples_per_s']:.0f}" if v["samples_per_s"] else "-"
            shown.append(f"{phase} {f} ({v['updates']} upd)")
        extra = "; ".join(shown) + (f"; final split {final}" if "auto" in variant else "")
    eff = f"{e['balance_eff']:.3f}" if e.get("balance_eff") is not None else "-"
    print(f"{rec['samples_per_s']:10.1f} {eff:>5}\n{extra}")
with open(results, "a") as f:
    f.write(json.dumps(rec) + "\n")
PYEOF
}

# one_run CASE REPEAT VARIANT IMPL "CPUS" "BATCHES" UPDATES LOG_INTERVAL "FLAGS" STAMP LOADED: one run and
# its row (the run's details, if any, on a second line).
one_run() {
  local case="$1" i="$2" variant="$3" impl="$4" cpu_list="$5" batch_list="$6" updates="$7" name load before
  local cpu row total=0 b
  for b in $batch_list; do total=$((total + b)); done
  name="$case.$i.$variant"
  [ "$(fingerprint "$TRAIN")" = "$TRAIN_ID" ] || die "$TRAIN changed during the benchmark (rebuilt?)"
  wait_quiet "$QUIET_WAIT"
  load="$(load1)"; before="$(cpu_jiffies)"
  run_ranks "$name" "$impl" "$cpu_list" "$batch_list" "$updates" "$8" "$9" "${10}" "${11}"
  cpu="$(cpu_percent "$before" "$(cpu_jiffies)")"
  row="$(analyse "$name" "$case" "$variant" "$i" "$impl" "$updates" "$total" "$LAUNCH_MS")"
  printf '%-9s %-3s %-16s %s %6s %5s\n' "$case" "$i" "$variant" "${row%%$'\n'*}" "$load" "$cpu"
  if [ "$row" != "${row#*$'\n'}" ] && [ -n "${row#*$'\n'}" ]; then printf '%31s %s\n' "" "${row#*$'\n'}"; fi
}

echo "# Automatic balancing (hetseq --auto-balance): MNIST on this machine's CPUs, global samples/s"
echo "# Adam lr 0.001, 1 intra-op thread per rank, Gloo on loopback, $REPEATS repeats, cases $CASES"
echo "# hetseq: $TRAIN"
echo "# python: $PY $PEER (torch $TORCH_VERSION)"
echo "# machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)"
echo "# runs kept in: ${OUT:-(temporary)}"
echo "# start: $(uptime)"

header() {
  printf '%-9s %-3s %-16s %10s %5s %6s %5s\n' case run variant samples/s eff load1 cpu%
}

for c in "${CASE_LIST[@]}"; do
  case "$c" in
    static)
      echo "## static: 3 ranks on CPUs 0,0,1, 192 samples per update, $UPDATES updates per run"
      header
      SPLITS=("64 64 64" "56 56 80" "48 48 96" "40 40 112" "32 32 128")
      for ((i = 1; i <= REPEATS; i++)); do
        order=(); rev=()
        for s in "${SPLITS[@]}"; do order+=("static:$s"); done
        order+=("auto:64 64 64" "python:64 64 64")
        if ((i % 2 == 0)); then
          for ((k = ${#order[@]} - 1; k >= 0; k--)); do rev+=("${order[$k]}"); done
          order=("${rev[@]}"); rev=()
        fi
        for v in "${order[@]}"; do
          kind="${v%%:*}"; split="${v#*:}"
          case "$kind" in
            static) one_run static "$i" "static-${split// /-}" hetseq "0 0 1" "$split" "$UPDATES" 1000000 "" 0 0 ;;
            auto) one_run static "$i" auto hetseq "0 0 1" "$split" "$UPDATES" 1000000 --auto-balance 0 0 ;;
            python) one_run static "$i" python python "0 0 1" "$split" "$UPDATES" 0 "" 0 0 ;;
          esac
        done
      done
      ;;
    changing)
      echo "## changing: 2 ranks on CPUs 0 and 1, 64+64 samples per update, $CHANGING_UPDATES updates per run;"
      echo "## a busy loop on CPU 1 from $LOAD_A to $LOAD_B s after rank 0's first update"
      # The peer prints nothing before it ends: a run of 2 updates measures its start-up, which places
      # the load in its first run (later runs use the previous run's).
      run_ranks changing.0.python-startup python "0 1" "64 64" 2 0 "" 1 0
      PEER_DELAY_MS="$("$PY" -c 'import json, sys
t, _, line = open(sys.argv[1]).readline().partition(" ")
print(round(1000 * (float(t) - json.loads(line)["seconds"]) - int(sys.argv[2])))' \
        "$WORK/changing.0.python-startup.0.out" "$LAUNCH_MS")" || die "no start-up time in the peer's first output"
      echo "# the peer's start-up: $PEER_DELAY_MS ms from its launch to its first update"
      header
      for ((i = 1; i <= REPEATS; i++)); do
        if ((i % 2 == 1)); then order=(equal auto python); else order=(python auto equal); fi
        for v in "${order[@]}"; do
          case "$v" in
            equal) one_run changing "$i" equal hetseq "0 1" "64 64" "$CHANGING_UPDATES" 1 "" 1 1 ;;
            auto) one_run changing "$i" auto hetseq "0 1" "64 64" "$CHANGING_UPDATES" 1 --auto-balance 1 1 ;;
            python)
              one_run changing "$i" python python "0 1" "64 64" "$CHANGING_UPDATES" 0 "" 1 1
              PEER_DELAY_MS="$("$PY" -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print([r for r in rows if r["name"] == sys.argv[2]][-1].get("delay_ms", sys.argv[3]))' \
                "$RESULTS" "changing.$i.python" "$PEER_DELAY_MS")"
              ;;
          esac
        done
      done
      ;;
    overhead)
      echo "## overhead: 2 ranks on CPUs 0 and 1, 64+64 samples per update, $UPDATES updates per run"
      header
      for ((i = 1; i <= REPEATS; i++)); do
        if ((i % 2 == 1)); then order=(equal auto); else order=(auto equal); fi
        for v in "${order[@]}"; do
          case "$v" in
            equal) one_run overhead "$i" equal hetseq "0 1" "64 64" "$UPDATES" 1000000 "" 0 0 ;;
            auto) one_run overhead "$i" auto hetseq "0 1" "64 64" "$UPDATES" 1000000 --auto-balance 0 0 ;;
          esac
        done
      done
      ;;
  esac
done
echo "# end: $(uptime)"

# Medians per case and variant, ratios and targets; prints "plot AUTO_NAME EQUAL_NAME" for the changing case.
SUMMARY="$("$PY" - "$RESULTS" <<'PYEOF'
import collections, json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in recs:
    by[(r["case"], r["variant"])].append(r)
med = lambda xs: statistics.median(xs) if xs else None
def fig(case, variant, key="samples_per_s"):
    return med([r[key] for r in by[(case, variant)] if r.get(key) is not None])
def verdict(ok):
    return "met" if ok else "MISSED"
def f1(v):
    return "-" if v is None else f"{v:.1f}"
def f3(v):
    return "-" if v is None else f"{v:.3f}"
cases = []
for r in recs:
    if r["case"] not in cases:
        cases.append(r["case"])
for case in cases:
    print(f"## {case}: medians over repeats")
    if case == "static":
        print(f"{'variant':<18} {'samples/s':>10} {'eff':>6}  runs")
        statics = [v for (c, v) in by if c == "static" and v.startswith("static-")]
        for v in statics + ["auto", "python"]:
            if (case, v) in by:
                runs = "/".join(f"{r['samples_per_s']:.0f}" for r in by[(case, v)])
                print(f"{v:<18} {f1(fig(case, v)):>10} {f3(fig(case, v, 'balance_eff')):>6}  {runs}")
        best = max(statics, key=lambda v: fig(case, v)) if statics else None
        auto, equal = fig(case, "auto"), fig(case, "static-64-64-64")
        if best and auto:
            print(f"best static split: {best[len('static-'):].replace('-', '/')} at {fig(case, best):.1f} samples/s")
            print(f"auto / best static: {auto / fig(case, best):.3f} (target >= 0.95: {verdict(auto >= 0.95 * fig(case, best))})")
        if equal and auto:
            print(f"auto / equal:       {auto / equal:.3f} (target >= 1.25: {verdict(auto >= 1.25 * equal)})")
        if by[(case, "auto")]:
            settles = [r["settle"] for r in by[(case, "auto")]]
            finals = " ".join("/".join(map(str, r["final_split"] or [])) for r in by[(case, "auto")])
            print(f"auto settled at update (last move > 5% of 192 samples): median {med(settles):g} "
                  f"(runs {'/'.join(map(str, settles))}); final splits {finals}")
    elif case == "changing":
        print(f"{'phase':<8} {'equal':>9} {'auto':>9} {'auto/equal':>11}  target")
        for phase, target in (("before", None), ("during", 1.2), ("after", 0.97)):
            e = med([r["phases"][phase]["samples_per_s"] for r in by[(case, "equal")]
                     if r.get("phases") and r["phases"][phase]["samples_per_s"]])
            a = med([r["phases"][phase]["samples_per_s"] for r in by[(case, "auto")]
                     if r.get("phases") and r["phases"][phase]["samples_per_s"]])
            ratio = a / e if a and e else None
            goal = ""
            if ratio is not None and phase == "during":
                goal = f">= 1.2: {verdict(ratio >= 1.2)}"
            elif ratio is not None and phase == "after":
                goal = f"within 3%: {verdict(abs(ratio - 1) <= 0.03)}"
            print(f"{phase:<8} {f1(e):>9} {f1(a):>9} {f3(ratio):>11}  {goal}")
        e, a, p = fig(case, "equal"), fig(case, "auto"), fig(case, "python")
        print(f"whole run: equal {f1(e)}, auto {f1(a)} (eff {f3(fig(case, 'equal', 'balance_eff'))} / "
              f"{f3(fig(case, 'auto', 'balance_eff'))}), python DDP {f1(p)} samples/s")
        if p is not None:
            print("python DDP reports no per-update timing: only its whole-run samples/s, under the same load "
                  "schedule placed by its launch time (its rows show where the load fell in its timed span)")
        autos = [r for r in by[(case, "auto")] if r.get("phases") and r["phases"]["during"]["samples_per_s"]]
        if autos:
            autos.sort(key=lambda r: r["phases"]["during"]["samples_per_s"])
            pick = autos[(len(autos) - 1) // 2]
            eq = [r for r in by[(case, "equal")] if r["repeat"] == pick["repeat"]]
            if eq:
                print(f"plot {pick['name']} {eq[0]['name']}")
    elif case == "overhead":
        e, a = fig(case, "equal"), fig(case, "auto")
        for v in ("equal", "auto"):
            runs = "/".join(f"{r['samples_per_s']:.0f}" for r in by[(case, v)])
            print(f"{v:<8} {f1(fig(case, v)):>10} eff {f3(fig(case, v, 'balance_eff'))}  runs {runs}")
        if e and a:
            print(f"auto / equal: {a / e:.3f}; auto costs {100 * (1 - a / e):.1f}% of samples/s "
                  f"(target <= 2%: {verdict(a >= 0.98 * e)})")
PYEOF
)"
grep -v '^plot ' <<<"$SUMMARY" || true
PICK="$(sed -n 's/^plot //p' <<<"$SUMMARY")"
if [ -n "$PICK" ]; then
  read -r AUTO_RUN EQUAL_RUN <<<"$PICK"
  read -r AUTO_A AUTO_B <"$WORK/$AUTO_RUN.load"
  read -r EQUAL_A EQUAL_B <"$WORK/$EQUAL_RUN.load"
  "$PY" "$PLOTTER" --auto "$WORK/$AUTO_RUN.0.out" --auto-load "$AUTO_A,$AUTO_B" \
    --equal "$WORK/$EQUAL_RUN.0.out" --equal-load "$EQUAL_A,$EQUAL_B" --out "$PLOT" ||
    die "plot_balance.py failed"
  echo "# plot of runs $AUTO_RUN and $EQUAL_RUN: $PLOT"
fi
