#!/usr/bin/env python3
"""Plain text to BERT pretraining shards in HetSeq's HDF5 format (read by `hetseq-train --task bert`).

Input: text files with one sentence per line and a blank line between documents. Output, in --output-dir:
PREFIX_train_K.hdf5 and PREFIX_test_K.hdf5 (K = 0, 1, ...), each with the datasets
  input_ids, input_mask, segment_ids        int32/int8 [N, max_seq_length]
  masked_lm_positions, masked_lm_ids        int32 [N, max_predictions_per_seq], padded with 0
  next_sentence_labels                      int8 [N]: 0 when B follows A in the text, 1 when B is random

The recipe is BERT's (Devlin et al. 2019, and Google's create_pretraining_data): WordPiece tokens; each document
is cut into chunks of sentences that fill max_seq_length - 3 tokens (with probability --short-seq-prob a shorter
random target, to match fine-tuning lengths); each chunk becomes a pair [CLS] A [SEP] B [SEP] where half of the time
B is a random span of another document (label 1), else the rest of the chunk (label 0; a chunk of one sentence
then takes the document's next sentence as B, or the one before as A, so that only documents of one sentence
always get a random B); the longer side is trimmed
from a random end until the pair fits; --masked-lm-prob of the tokens (at most --max-predictions-per-seq, at least
one) are chosen for prediction, of which 80% become [MASK], 10% a random token and 10% stay unchanged. The documents
are passed over --dupe-factor times with fresh random choices. Documents (not sequences) are split into train and
test, so no text of a test sequence is in the training shards. Everything depends only on --seed.

Holds one split's sequences in memory; for a corpus larger than memory, run it on parts with different --prefix.
"""
import argparse
import os
import random
import sys

import h5py
import numpy as np
from tokenizers import BertWordPieceTokenizer


def read_documents(paths):
    documents, current = [], []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line:
                    current.append(line)
                elif current:
                    documents.append(current)
                    current = []
        if current:
            documents.append(current)
            current = []
    return documents


def tokenize(documents, tokenizer):
    flat = [s for d in documents for s in d]
    ids = [e.ids for e in tokenizer.encode_batch(flat, add_special_tokens=False)]
    out, k = [], 0
    for d in documents:
        sentences = [s for s in ids[k:k + len(d)] if s]
        k += len(d)
        if sentences:
            out.append(sentences)
    return out


def trim_pair(a, b, max_tokens, rng):
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


class Recipe:
    def __init__(self, args, vocab):
        self.args = args
        self.cls, self.sep, self.mask = vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]
        # Random replacements are drawn from the ordinary tokens (not [PAD], [unusedN], [CLS], ...).
        self.ordinary = np.array(sorted(i for t, i in vocab.items() if not (t.startswith("[") and t.endswith("]"))))

    def pairs(self, documents, index, rng):
        """The (tokens_a, tokens_b, is_random_next) pairs of documents[index]."""
        doc = documents[index]
        max_tokens = self.args.max_seq_length - 3
        target = max_tokens if rng.random() >= self.args.short_seq_prob else rng.randint(2, max_tokens)
        chunk, length, i = [], 0, 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= target:
                random_next = len(documents) > 1 and rng.random() < 0.5
                if not random_next and len(chunk) == 1:
                    # A one-sentence chunk gets an actual next sentence: the document's next one as B, or, for
                    # its last sentence, the one before as A. (Google's code forces a random B here, which
                    # makes random pairs a majority in corpora of short documents.)
                    if i + 1 < len(doc):
                        i += 1
                        chunk.append(doc[i])
                    elif i > 0:
                        chunk.insert(0, doc[i - 1])
                if len(chunk) == 1 and len(documents) > 1:
                    random_next = True  # a document of one sentence
                a_end = 1 if len(chunk) < 2 else rng.randint(1, len(chunk) - 1)
                a = [t for s in chunk[:a_end] for t in s]
                if random_next:
                    is_random = True
                    other = index
                    while other == index:
                        other = rng.randrange(len(documents))
                    b = []
                    source = documents[other]
                    for s in source[rng.randrange(len(source)):]:
                        b.extend(s)
                        if len(b) >= target - len(a):
                            break
                    i -= len(chunk) - a_end  # the unused sentences start the next chunk
                else:
                    is_random = False
                    b = [t for s in chunk[a_end:] for t in s]
                trim_pair(a, b, max_tokens, rng)
                if a and b:
                    yield a, b, is_random
                chunk, length = [], 0
                target = max_tokens if rng.random() >= self.args.short_seq_prob else rng.randint(2, max_tokens)
            i += 1

    def instance(self, a, b, is_random, rng):
        args = self.args
        tokens = [self.cls] + a + [self.sep] + b + [self.sep]
        segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        candidates = [k for k, t in enumerate(tokens) if t not in (self.cls, self.sep)]
        rng.shuffle(candidates)
        count = min(args.max_predictions_per_seq, max(1, int(round(len(tokens) * args.masked_lm_prob))))
        chosen = sorted(candidates[:count])
        masked_ids = [tokens[k] for k in chosen]
        for k in chosen:
            r = rng.random()
            if r < 0.8:
                tokens[k] = self.mask
            elif r >= 0.9:
                tokens[k] = int(self.ordinary[rng.randrange(len(self.ordinary))])
        n, p = args.max_seq_length, args.max_predictions_per_seq
        row = {
            "input_ids": tokens + [0] * (n - len(tokens)),
            "input_mask": [1] * len(tokens) + [0] * (n - len(tokens)),
            "segment_ids": segments + [0] * (n - len(segments)),
            "masked_lm_positions": chosen + [0] * (p - len(chosen)),
            "masked_lm_ids": masked_ids + [0] * (p - len(masked_ids)),
            "next_sentence_labels": int(is_random),
        }
        return row


DTYPES = {"input_ids": "i4", "input_mask": "i1", "segment_ids": "i1", "masked_lm_positions": "i4",
          "masked_lm_ids": "i4", "next_sentence_labels": "i1"}


def write_shards(rows, split, args):
    paths = []
    for k, start in enumerate(range(0, len(rows), args.shard_size)):
        part = rows[start:start + args.shard_size]
        path = os.path.join(args.output_dir, f"{args.prefix}_{split}_{k}.hdf5")
        tmp = path + ".tmp"
        with h5py.File(tmp, "w") as f:
            for name, dtype in DTYPES.items():
                f.create_dataset(name, data=np.array([r[name] for r in part], dtype=dtype))
        os.replace(tmp, path)
        paths.append(path)
    return paths


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True, help="text files: a sentence a line, documents apart")
    parser.add_argument("--vocab", required=True, help="WordPiece vocab.txt (e.g. bert-base-uncased's)")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--prefix", default="bert", help="shard names: PREFIX_train_K.hdf5, PREFIX_test_K.hdf5")
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--max-predictions-per-seq", type=int, default=20)
    parser.add_argument("--masked-lm-prob", type=float, default=0.15)
    parser.add_argument("--short-seq-prob", type=float, default=0.1)
    parser.add_argument("--dupe-factor", type=int, default=5)
    parser.add_argument("--test-fraction", type=float, default=0.05, help="share of documents for the test split")
    parser.add_argument("--shard-size", type=int, default=10000, help="sequences per shard")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--cased", action="store_true", help="keep case (for a cased vocabulary)")
    args = parser.parse_args()
    if "train" in args.prefix or "test" in args.prefix:
        parser.error("--prefix must not contain 'train' or 'test' (the split is found from the file name)")
    if args.max_seq_length < 8 or args.max_predictions_per_seq < 1 or args.dupe_factor < 1 or args.shard_size < 1:
        parser.error("--max-seq-length >= 8, --max-predictions-per-seq, --dupe-factor and --shard-size >= 1")
    if not 0.0 < args.test_fraction < 1.0:
        parser.error("--test-fraction must lie in (0, 1)")

    tokenizer = BertWordPieceTokenizer(args.vocab, lowercase=not args.cased)
    vocab = tokenizer.get_vocab()
    documents = tokenize(read_documents(args.input), tokenizer)
    if len(documents) < 2:
        sys.exit(f"bert_preprocess.py: error: {args.input} hold {len(documents)} document(s); need at least 2")
    rng = random.Random(args.seed)
    rng.shuffle(documents)
    n_test = max(1, int(round(len(documents) * args.test_fraction)))
    splits = {"test": documents[:n_test], "train": documents[n_test:]}
    os.makedirs(args.output_dir, exist_ok=True)
    recipe = Recipe(args, vocab)
    for split, docs in splits.items():
        rows = []
        for _ in range(args.dupe_factor):
            for index in range(len(docs)):
                for a, b, is_random in recipe.pairs(docs, index, rng):
                    rows.append(recipe.instance(a, b, is_random, rng))
        rng.shuffle(rows)
        paths = write_shards(rows, split, args)
        masked = sum(sum(1 for p in r["masked_lm_positions"] if p) for r in rows)
        random_next = sum(r["next_sentence_labels"] for r in rows)
        print(f"[bert_preprocess] {split}: {len(docs)} documents -> {len(rows)} sequences "
              f"({masked / max(1, len(rows)):.1f} masked tokens and {100.0 * random_next / max(1, len(rows)):.0f}% "
              f"random next on average) in {len(paths)} shard(s): {', '.join(os.path.basename(p) for p in paths)}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
