#!/usr/bin/env bash
# What a communication hook does to training: the loss curves of 2-worker runs with --ddp-comm-hook none,
# fp16, bf16 and powersgd, next to the noise of the exact run (none with another --seed).
#
#   benchmarks/comm_hook_loss.sh [--tasks mnist,bert] [--mnist-updates N] [--bert-updates N] [--build DIR]
#                                [--bert-data DIR] [--powersgd-start-update N]
#
# mnist: 2 CPU workers (--distributed-gpus 2), 64 samples each, Adam lr 0.001, --mnist-updates updates
#        (default 469, one epoch of Fashion-MNIST), validated on the test split at the end.
# bert:  tiny BERT (configs/bert-tiny.json) on the shards of scripts/train_bert.sh, 2 CPU workers of 16
#        sequences, scripts/train_bert.sh's optimiser and schedule, --bert-updates updates (default 100); validated
#        on the test shard only when that reaches the end of an epoch (1600 updates).
# PowerSGD runs with rank 1 after --powersgd-start-update uncompressed updates (default 50).
# Prints the training loss (bits) every 50 updates and the final validation loss (and accuracy for mnist)
# per run; "none, seed 2" is the exact run with another initialisation and data order: the noise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=benchmarks/common.sh
source "$ROOT/benchmarks/common.sh"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
TASKS="mnist,bert"
MNIST_UPDATES=469
BERT_UPDATES=100
BUILD="$ROOT/build"
BERT_DATA="$HETSEQ_HOME/bert/jargon-128"
PSGD_START=50
PY="${HETSEQ_PYTHON:-$HETSEQ_HOME/venv-torch-2.11.0/bin/python}"
while [ "$#" -gt 0 ]; do
  case "$1" in
    --tasks) need_value "$@"; TASKS="$2"; shift 2 ;;
    --mnist-updates) need_value "$@"; MNIST_UPDATES="$2"; shift 2 ;;
    --bert-updates) need_value "$@"; BERT_UPDATES="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --bert-data) need_value "$@"; BERT_DATA="$2"; shift 2 ;;
    --powersgd-start-update) need_value "$@"; PSGD_START="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
TRAIN="$BUILD/bin/hetseq-train"
[ -x "$TRAIN" ] || die "$TRAIN not found; build first (scripts/build.sh)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/comm_hook_loss.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

run() {  # run TASK HOOK SEED -> the JSON log in $WORK/TASK.HOOK.SEED.out
  local task="$1" hook="$2" seed="$3" args=()
  if [ "$task" = mnist ]; then
    args=(--task mnist --max-sentences 64 --optimizer adam --lr 0.001 --max-update "$MNIST_UPDATES" --num-workers 0
          --valid-subset test --max-sentences-valid 1000)
  else
    ls "$BERT_DATA"/*train*.hdf5 >/dev/null 2>&1 || die "--bert-data $BERT_DATA has no shards; run scripts/train_bert.sh once"
    args=(--task bert --data "$BERT_DATA" --dict "$(dirname "$BERT_DATA")/vocab.txt" --config_file "$ROOT/configs/bert-tiny.json"
          --max-sentences 16 --optimizer adam --lr 0.001 --adam-betas "(0.9, 0.999)" --weight-decay 0.01 --clip-norm 1.0
          --lr_scheduler PolynomialDecayScheduler --warmup-updates 30 --total-num-update 300 --max-update "$BERT_UPDATES"
          --max_pred_length 20 --valid-subset test --num-workers 1)
  fi
  "$TRAIN" "${args[@]}" --cpu --distributed-world-size 2 --distributed-gpus 2 --distributed-init-method tcp://127.0.0.1:0 \
    --seed "$seed" --ddp-comm-hook "$hook" --powersgd-start-update "$PSGD_START" --intra-op-threads 1 --no-save \
    --log-format json --log-interval 50 --no-progress-bar >"$WORK/$task.$hook.$seed.out" 2>"$WORK/err" ||
    { tail -n 5 "$WORK/err" >&2; die "$task --ddp-comm-hook $hook --seed $seed failed"; }
}

IFS=, read -r -a TASK_LIST <<<"$TASKS"
echo "# $(date -u +%F), $TRAIN, 2 CPU workers"
for task in "${TASK_LIST[@]}"; do
  for spec in none:1 fp16:1 bf16:1 powersgd:1 none:2; do
    run "$task" "${spec%%:*}" "${spec##*:}"
  done
  "$PY" - "$WORK" "$task" <<'PYEOF'
import json, sys
work, task = sys.argv[1], sys.argv[2]
rows = {}
for spec in ["none:1", "fp16:1", "bf16:1", "powersgd:1", "none:2"]:
    hook, seed = spec.split(":")
    lines = [json.loads(l) for l in open(f"{work}/{task}.{hook}.{seed}.out") if l.startswith("{")]
    train = [r for r in lines if r.get("tag") == "train"]
    valid = ([r for r in lines if r.get("tag") == "valid"] or [{"loss": float("nan")}])[-1]
    rows[f"{hook}, seed {seed}"] = (train, valid)
updates = [r["num_updates"] for r in next(iter(rows.values()))[0]]
extra = "accuracy" if task == "mnist" else "mlm_accuracy"
# Validation runs at the end of an epoch: a run shorter than one (bert's default) has none.
validated = all("accuracy" in v or extra in v for _, v in rows.values())
print(f"\n## {task}: training loss (bits) at each 50 updates" + ("; final validation" if validated else
      " (no validation: the run ends inside the first epoch)"))
print("| run | " + " | ".join(str(u) for u in updates) + (f" | valid loss | valid {extra} |" if validated else " |"))
print("|---" * (len(updates) + (3 if validated else 1)) + "|")
for name, (train, valid) in rows.items():
    cells = " | ".join("%.4f" % r["loss"] for r in train)
    if validated:
        acc = valid.get(extra, valid.get("accuracy", float("nan")))
        cells += " | %.4f | %s" % (valid["loss"], acc)
    print(f"| {name} | {cells} |")
PYEOF
done
