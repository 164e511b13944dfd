#!/usr/bin/env bash
# The BERT example as a test (ctest `bert_trains_from_text`): preprocesses the shipped corpus (the Jargon File,
# scripts/bert_assets.py) with scripts/bert_preprocess.py into a temporary directory, pretrains tiny BERT on 2 CPU
# workers as scripts/train_bert.sh does, but for 150 updates with 8 sequences of 64 tokens per worker instead
# of 16 of 128, and the corpus read once (dupe factor 1: 7041 training sequences, more than the run's 2400, and a
# test split of 374 for validation), and checks that the training loss falls steadily (the mean loss of each
# block of 50 updates below the one before, and the last 25 updates at least 3 bits below the first 25) and
# that validation ran. (300 updates, dupe factor 5 and blocks of 100 took 70 s of the suite; this takes 25.)
#   bert_train_check.sh PATH/TO/hetseq-train
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
train="${1:?usage: bert_train_check.sh PATH/TO/hetseq-train}"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
py="${HETSEQ_PYTHON:-$HETSEQ_HOME/venv-torch-2.11.0/bin/python}"
assets="$HETSEQ_HOME/bert"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$py" "$root/scripts/bert_assets.py" --out "$assets"
"$py" "$root/scripts/bert_preprocess.py" --input "$assets/jargon.txt" --vocab "$assets/vocab.txt" \
  --output-dir "$work/data" --prefix jargon --max-seq-length 64 --max-predictions-per-seq 10 --dupe-factor 1 \
  --seed 12345
"$train" --task bert --data "$work/data" --dict "$assets/vocab.txt" --config_file "$root/configs/bert-tiny.json" \
  --cpu --distributed-world-size 2 --distributed-gpus 2 --distributed-init-method tcp://127.0.0.1:0 \
  --max-sentences 8 --optimizer adam --lr 0.001 --adam-betas "(0.9, 0.999)" --weight-decay 0.01 --clip-norm 1.0 \
  --lr_scheduler PolynomialDecayScheduler --warmup-updates 15 --total-num-update 150 --max-update 150 \
  --max_pred_length 10 --valid-subset test --num-workers 2 --log-interval 25 --log-format json --no-progress-bar \
  --save-dir "$work/save" >"$work/log.json"
"$py" - "$work/log.json" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
train = [r for r in rows if r["tag"] == "train"]
valid = [r for r in rows if r["tag"] == "valid"]
# The logged loss is the running mean over the epoch, weighted by sequences (16 per update): recover the mean
# of each 25-update interval.
intervals, done, total = [], 0, 0.0
for r in train:
    n = int(r["num_updates"])
    intervals.append((r["loss"] * n - total) / (n - done))
    done, total = n, r["loss"] * n
print("interval losses (bits per sequence):", " ".join("%.2f" % x for x in intervals))
assert len(intervals) == 6 and done == 150, f"expected 6 intervals up to update 150, got {len(intervals)} up to {done}"
blocks = [sum(intervals[i:i + 2]) / 2 for i in (0, 2, 4)]
print("blocks of 50 updates:", " ".join("%.2f" % b for b in blocks))
assert blocks[0] > blocks[1] > blocks[2], "the loss of each 50 updates must fall"
assert intervals[-1] < intervals[0] - 3, "the last 25 updates must be at least 3 bits below the first 25"
assert valid and valid[-1]["subset"] == "test", "no validation on the test split"
print("validation: loss %.2f bits, MLM accuracy %.1f%%" % (valid[-1]["loss"], valid[-1]["mlm_accuracy"]))
PYEOF
