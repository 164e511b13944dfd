#!/usr/bin/env bash
# The BERT example, end to end from plain text: builds if needed; makes the data with scripts/bert_data.sh (the
# Jargon File with bert-base-uncased's vocabulary, as HDF5 shards of 128 tokens by BERT's recipe); then pretrains tiny BERT
# (configs/bert-tiny.json) for 300 updates and validates on the test shard. Extra arguments go to hetseq-train
# (e.g. --max-update 1000, --config_file configs/bert-base-uncased.json).
#
# Without a GPU: 2 CPU workers over Gloo on this machine, 16 sequences each (32 per update). With GPUs: one
# worker per visible device, 32 sequences each. Files go to $HETSEQ_HOME/bert (default ~/.cache/hetseq/bert);
# the model to checkpoints/bert.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HETSEQ_BUILD_DIR:-$root/build}"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
assets="$HETSEQ_HOME/bert"
bash "$root/scripts/build.sh" --target hetseq-train hetseq-eval >/dev/null

data="$(bash "$root/scripts/bert_data.sh")"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  workers=(--max-sentences 32)
else
  workers=(--cpu --distributed-world-size 2 --distributed-gpus 2 --max-sentences 16)
fi
"$build/bin/hetseq-train" --task bert --data "$data" --dict "$assets/vocab.txt" \
  --config_file "$root/configs/bert-tiny.json" "${workers[@]}" --distributed-init-method tcp://127.0.0.1:0 \
  --optimizer adam --lr 0.001 --adam-betas "(0.9, 0.999)" --weight-decay 0.01 --clip-norm 1.0 \
  --lr_scheduler PolynomialDecayScheduler --warmup-updates 30 --total-num-update 300 --max-update 300 \
  --max_pred_length 20 --valid-subset test --num-workers 2 --log-interval 25 --save-dir "$root/checkpoints/bert" "$@"
