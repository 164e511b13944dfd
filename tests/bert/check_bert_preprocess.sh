#!/usr/bin/env bash
# ctest `bert_preprocess_recipe`: makes the BERT assets if needed and runs check_bert_preprocess.py with the
# project's Python environment (scripts/setup.sh).   check_bert_preprocess.sh REPOSITORY_ROOT
set -euo pipefail
root="${1:?usage: check_bert_preprocess.sh REPOSITORY_ROOT}"
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
py="${HETSEQ_PYTHON:-$HETSEQ_HOME/venv-torch-2.11.0/bin/python}"
"$py" "$root/scripts/bert_assets.py" --out "$HETSEQ_HOME/bert"
"$py" "$root/tests/bert/check_bert_preprocess.py" "$root" "$HETSEQ_HOME/bert"
