#!/usr/bin/env bash
# A slow rank that sits out (Note [Sitting out]): MNIST on this machine's two CPUs, one rank held to 1% of a
# CPU by a cgroup quota, against the two fast ranks alone with the same global batch, alternating in one run.
#
#   benchmarks/sit_out.sh [--repeats R] [--updates N] [--steady-from K] [--quota US] [--build DIR]
#                         [--data DIR] [--python PY] [--out DIR] [--whole SHORT]
#
# Variants, one after the other within each repeat (R repeats, default 3):
#   sit-out: 3 ranks, --max-sentences 95/95/2 (192 samples per update), --auto-balance: rank 0 on CPU 0,
#            ranks 1 and 2 on CPU 1, rank 2 in a cgroup (v1 `cpu` controller, /sys/fs/cgroup/cpu) held to
#            --quota microseconds of every 100000 (default 1000: 1% of a CPU).
#   two:     ranks 0 and 1 alone at 96/96 on CPUs 0 and 1 (the same 192 samples per update).
# Each rank is its own process with one intra-op thread, started with `taskset -c CPU` over a fresh
# file:// rendezvous, Gloo on loopback and the shared-memory reduction; plain SGD (lr 0.05, whose weights
# show the rounding of sums taken in another order as it is, where Adam's normalised steps would amplify it),
# dropout 0, --updates updates (default 300) of Fashion-MNIST (--data, default /usr/share/datasets/fashion-mnist), no validation.
# A run's figure is its steady-state samples/s: the samples of updates K+1..N (--steady-from K, default
# 60) over the wall time between the end of update K and the end of update N (the `wall_s` of rank 0's
# JSON train lines). Printed per run, then the median of each variant and of sit-out / two per repeat
# (target >= 0.9). Each sit-out run also prints its "[balance] rank 2 sits out" line, and both variants the
# largest difference between their final weights and those of one process that trains on the same 192
# samples per update (with PY's torch; default: the torch wheel's venv from scripts/setup.sh): the two
# ranks alone show what summing in another order alone gives.
# --whole SHORT: the whole run instead of its steady state, validations (the test split, at the epoch's end and at
# --updates) included: each variant runs SHORT and N updates, and its figure is the samples of updates SHORT+1..N
# over the difference of the two runs' times, so that what both runs share (the first updates, the final
# validation and save) cancels. Two times: the training loop's (rank 0's "[train] done: ... s", from the first
# update to the last save) and the processes' (start to exit of every rank). The second also holds the slow
# rank's start-up, about a minute at 1% of a CPU that varies by 10 s from run to run, which the difference does not
# cancel. E.g. --updates 450 --whole 150: the 450-update run validates at the end of epoch 1 (update 313) and at
# 450, the 150-update run at 150.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/benchmarks/common.sh"

repeats=3 updates=300 steady=60 quota=1000 build="$root/build" data=/usr/share/datasets/fashion-mnist python=""
out="" whole=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    --repeats) need_value "$@"; repeats="$2"; shift 2 ;;
    --updates) need_value "$@"; updates="$2"; shift 2 ;;
    --steady-from) need_value "$@"; steady="$2"; shift 2 ;;
    --quota) need_value "$@"; quota="$2"; shift 2 ;;
    --build) need_value "$@"; build="$2"; shift 2 ;;
    --data) need_value "$@"; data="$2"; shift 2 ;;
    --python) need_value "$@"; python="$2"; shift 2 ;;
    --out) need_value "$@"; out="$2"; shift 2 ;;
    --whole) need_value "$@"; whole="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[ "$steady" -lt "$updates" ] || die "--steady-from $steady must be below --updates $updates"
train="$build/bin/hetseq-train"
[ -x "$train" ] || die "$train not found: build first (bash scripts/build.sh)"
[ -d "$data" ] || die "--data $data: no such directory"
[ -n "$python" ] || python="$(cd "$(bash "$root/scripts/setup.sh" --print-prefix | tail -n 1)/../../../../../.." && pwd)/bin/python"
[ -x "$python" ] || die "--python $python: not found"
cg=/sys/fs/cgroup/cpu
[ -w "$cg" ] || die "$cg is not writable: the cgroup v1 cpu controller is needed to hold a rank to --quota"
group="$cg/hetseq-sit-out-$$"
mkdir "$group"
echo 100000 >"$group/cpu.cfs_period_us"
echo "$quota" >"$group/cpu.cfs_quota_us"
out="${out:-$(mktemp -d /tmp/hetseq-sit-out.XXXXXX)}"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rmdir "$group" 2>/dev/null || true
}
trap cleanup EXIT

validation=(--disable-validation)
[ "$whole" -eq 0 ] || validation=(--valid-subset test)
common=(--task mnist --data "$data" --cpu --dropout 0,0 --optimizer sgd --lr 0.05 --num-workers 0
        --intra-op-threads 1 --no-progress-bar --log-format json --log-interval 1 "${validation[@]}"
        --distributed-timeout 120 --seed 3)
max_update="$updates"

# run_ranks DIR WORLD "cpu:batch[:slow]"... : one run, each rank pinned, the slow one in the cgroup.
run_ranks() {
  local dir="$1" world="$2"; shift 2
  mkdir -p "$dir"
  local r=0 spec cpu batch slow
  pids=()
  for spec in "$@"; do
    IFS=: read -r cpu batch slow <<<"$spec"
    local args=("${common[@]}" --max-update "$max_update" --save-dir "$dir/save" --max-sentences "$batch" --distributed-world-size "$world"
                --distributed-rank "$r" --distributed-init-method "file://$dir/rendezvous")
    [ "$world" -eq 3 ] && args+=(--auto-balance)
    if [ -n "$slow" ]; then
      OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$group" \
        taskset -c "$cpu" "$train" "${args[@]}" >"$dir/rank$r.out" 2>"$dir/rank$r.err" &
    else
      OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c "$cpu" "$train" "${args[@]}" >"$dir/rank$r.out" \
        2>"$dir/rank$r.err" &
    fi
    pids+=("$!")
    r=$((r + 1))
  done
  local failed=0 p
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  pids=()
  [ "$failed" -eq 0 ] || { tail -n 5 "$dir"/rank*.err >&2; die "a rank of $dir failed (logs above)"; }
}

# Steady-state samples/s of rank 0's JSON lines in DIR.
steady_rate() {
  "$python" - "$1/rank0.out" "$steady" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = {r["num_updates"]: r for r in rows if r.get("tag") == "train"}
k, n = int(sys.argv[2]), max(rows)
samples = sum(sum(rows[u]["split"]) for u in range(k + 1, n + 1))
print(f"{samples / (rows[n]['wall_s'] - rows[k]['wall_s']):.1f}")
EOF
}

# The largest difference between the model weights of two checkpoints.
weight_diff() {
  "$python" - "$1" "$2" <<'EOF'
import sys, torch
a = torch.load(sys.argv[1], weights_only=True, map_location="cpu")["model"]
b = torch.load(sys.argv[2], weights_only=True, map_location="cpu")["model"]
print(f"{max((a[k] - b[k]).abs().max().item() for k in a):.3g} (largest weight {max(a[k].abs().max().item() for k in a):.3g})")
EOF
}

# whole_rate VARIANT_DIR_PREFIX WORLD SPECS...: --whole's figure of one variant (runs of SHORT and N updates).
whole_rate() {
  local dir="$1" world="$2"; shift 2
  local t0 t1 t2
  t0="$(date +%s.%N)"; max_update="$whole" run_ranks "$dir-short" "$world" "$@"
  t1="$(date +%s.%N)"; max_update="$updates" run_ranks "$dir-long" "$world" "$@"
  t2="$(date +%s.%N)"
  local loop_short loop_long
  loop_short="$(sed -n 's/.*\[train\] done: .*, \([0-9.]*\) s$/\1/p' "$dir-short/rank0.err" | tail -n 1)"
  loop_long="$(sed -n 's/.*\[train\] done: .*, \([0-9.]*\) s$/\1/p' "$dir-long/rank0.err" | tail -n 1)"
  "$python" -c "print(f'{192 * ($updates - $whole) / ($loop_long - $loop_short):.1f}', f'{192 * ($updates - $whole) / (($t2 - $t1) - ($t1 - $t0)):.1f}')"
}

if [ "$whole" -gt 0 ]; then
  [ "$whole" -lt "$updates" ] || die "--whole $whole must be below --updates $updates"
  echo "[sit-out] whole runs: $repeats repeats of $whole and $updates updates with validation, rank 2 held to" \
       "$quota us of 100000; logs in ${out:=$(mktemp -d /tmp/hetseq-sit-out.XXXXXX)}"
  mkdir -p "$out"
  sit=() two=() ratios=() wall_ratios=()
  for i in $(seq 1 "$repeats"); do
    read -r a a_wall <<<"$(whole_rate "$out/sit-out-$i" 3 0:95 1:95 1:2:slow)"
    read -r b b_wall <<<"$(whole_rate "$out/two-$i" 2 0:96 1:96)"
    sit+=("$a") two+=("$b") ratios+=("$("$python" -c "print(f'{$a / $b:.3f}')")")
    wall_ratios+=("$("$python" -c "print(f'{$a_wall / $b_wall:.3f}')")")
    echo "[sit-out] repeat $i: whole runs, updates $((whole + 1))-$updates: training loop: sit-out $a samples/s, two" \
         "$b samples/s, ratio ${ratios[-1]}; processes: sit-out $a_wall, two $b_wall, ratio ${wall_ratios[-1]}"
  done
  median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
  echo "[sit-out] median (whole runs): training loop: sit-out $(median "${sit[@]}") samples/s, two" \
       "$(median "${two[@]}") samples/s, ratio $(median "${ratios[@]}") (target >= 0.9); processes: ratio" \
       "$(median "${wall_ratios[@]}")"
  exit 0
fi

echo "[sit-out] $repeats repeats of $updates updates, steady state from update $steady, rank 2 held to $quota us of" \
     "100000; logs in $out"
single="$out/single"
mkdir -p "$out"
"$train" "${common[@]}" --max-sentences 192 --save-dir "$single/save" >"$single.out" 2>"$single.err" ||
  die "one process failed: $(tail -n 3 "$single.err")"
sit=() two=() ratios=()
for i in $(seq 1 "$repeats"); do
  run_ranks "$out/sit-out-$i" 3 0:95 1:95 1:2:slow
  run_ranks "$out/two-$i" 2 0:96 1:96
  a="$(steady_rate "$out/sit-out-$i")" b="$(steady_rate "$out/two-$i")"
  sit+=("$a") two+=("$b") ratios+=("$("$python" -c "print(f'{$a / $b:.3f}')")")
  said="$(grep -o '\[balance\] rank 2 sits out.*' "$out/sit-out-$i/rank0.err" | head -n 1 || true)"
  echo "[sit-out] repeat $i: sit-out $a samples/s, two $b samples/s, ratio ${ratios[-1]}; ${said:-rank 2 never sat out}"
  echo "[sit-out] repeat $i: largest weight difference from one process: sit-out $(weight_diff \
        "$single/save/checkpoint_last.pt" "$out/sit-out-$i/save/checkpoint_last.pt"), two $(weight_diff \
        "$single/save/checkpoint_last.pt" "$out/two-$i/save/checkpoint_last.pt")"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "[sit-out] median: sit-out $(median "${sit[@]}") samples/s, two $(median "${two[@]}") samples/s," \
     "ratio $(median "${ratios[@]}") (target >= 0.9)"
