#!/usr/bin/env bash
# Your own plain text as BERT pretraining shards for hetseq-train --task bert:
#
#   scripts/make_bert_shards.sh CORPUS.txt OUT_DIR [--vocab FILE] [OPTIONS of scripts/bert_preprocess.py]
#
# CORPUS.txt: one sentence per line, a blank line between documents (at least two documents). OUT_DIR gets
# bert_train_K.hdf5 and bert_test_K.hdf5 (K = 0, 1, ...; 5% of the documents go to test), each with the datasets
# input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids and next_sentence_labels: HetSeq's and
# NVIDIA's BERT layout, made by BERT's recipe (scripts/bert_preprocess.py: 128 tokens a sequence, at most 20 masked,
# dupe factor 5, seed 12345; its options, e.g. --max-seq-length 512 --max-predictions-per-seq 80, go to it as given).
# --vocab: a WordPiece vocab.txt (default: bert-base-uncased's, which scripts/bert_assets.py takes from an installed
# package into $HETSEQ_HOME/bert/vocab.txt). The Python is the project's environment (scripts/setup.sh), or
# $HETSEQ_PYTHON. Exit codes: 2 for a bad command line, 3 for a corpus or vocabulary that is missing or unusable.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
me="make_bert_shards.sh"
usage="usage: scripts/$me CORPUS.txt OUT_DIR [--vocab FILE] [OPTIONS of scripts/bert_preprocess.py]"

usage_error() { echo "$me: error: $*" >&2; echo "$usage" >&2; exit 2; }
input_error() { echo "$me: error: $*" >&2; exit 3; }

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
[ "$#" -ge 2 ] || usage_error "give the corpus and the output directory"
corpus="$1"
out="$2"
shift 2
vocab=""
passed=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --vocab) [ "$#" -ge 2 ] || usage_error "--vocab needs a file"; vocab="$2"; shift 2 ;;
    --vocab=*) vocab="${1#--vocab=}"; shift ;;
    --input|--input=*|--output-dir|--output-dir=*)
      usage_error "$1: the corpus and the output directory are this script's first two arguments" ;;
    *) passed+=("$1"); shift ;;
  esac
done

if [ ! -e "$corpus" ]; then
  input_error "$corpus: no such file; give a text file with one sentence per line and a blank line between documents"
fi
[ -f "$corpus" ] || input_error "$corpus: not a regular file; give a text file with one sentence per line"
[ -r "$corpus" ] || input_error "$corpus: cannot be read; check its permissions"
grep -q '[^[:space:]]' "$corpus" ||
  input_error "$corpus: is empty (no sentence in it); write one sentence per line and a blank line between documents"
if [ -e "$out" ] && [ ! -d "$out" ]; then
  usage_error "$out: exists and is not a directory; give the directory for the shards"
fi

py="${HETSEQ_PYTHON:-$(bash "$root/scripts/setup.sh" --print-python | tail -n 1)}"
if [ -z "$vocab" ]; then
  assets="${HETSEQ_HOME:-$HOME/.cache/hetseq}/bert"
  "$py" "$root/scripts/bert_assets.py" --out "$assets" --skip-corpus >&2
  vocab="$assets/vocab.txt"
fi
[ -f "$vocab" ] || input_error "$vocab: no such file; --vocab takes a WordPiece vocab.txt (one token a line)"
for token in '[CLS]' '[SEP]' '[MASK]'; do
  grep -qxF "$token" "$vocab" ||
    input_error "$vocab: has no line '$token'; --vocab takes a BERT WordPiece vocab.txt (one token a line)"
done

code=0
"$py" "$root/scripts/bert_preprocess.py" --input "$corpus" --vocab "$vocab" --output-dir "$out" "${passed[@]}" ||
  code=$?
[ "$code" -ne 2 ] || exit 2  # an option that scripts/bert_preprocess.py refused (its usage is above)
[ "$code" -eq 0 ] || input_error "$corpus: no shards made from it (scripts/bert_preprocess.py's message is above)"
echo "[$me] shards in $out; train on them with (the config's vocab_size must be the vocabulary's size:" >&2
echo "  configs/bert-*.json have bert-base-uncased's 30522):" >&2
echo "  build/bin/hetseq-train --task bert --data $out --dict $vocab --config_file configs/bert-tiny.json \\" >&2
echo "    --max-sentences 16 --max-update 100 --valid-subset test" >&2
echo "$out"
