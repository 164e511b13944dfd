#!/usr/bin/env python3
"""ctest `bert_preprocess_recipe`: scripts/bert_preprocess.py on the shipped corpus follows BERT's recipe.

Preprocesses the Jargon File (made by scripts/bert_assets.py) with dupe factor 2 into a temporary directory and
checks every row of every shard: [CLS] A [SEP] B [SEP] with segment ids 0/1 and padding, the mask, the number of
predictions (15% of the tokens, at least 1, at most max_predictions_per_seq), never [CLS]/[SEP] masked, the
80/10/10 split of masked tokens ([MASK] / random / unchanged, within 2 points), half of the pairs random-next
(within 3 points); and that the same seed gives the same shards.

Usage: check_bert_preprocess.py ROOT (the repository) ASSETS (the bert_assets.py output directory)
"""
import glob
import hashlib
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

root, assets = sys.argv[1], sys.argv[2]
CLS, SEP, MASK = 101, 102, 103  # bert-base-uncased
SEQ, PRED = 64, 10


def preprocess(out):
    subprocess.run([sys.executable, os.path.join(root, "scripts/bert_preprocess.py"), "--input",
                    os.path.join(assets, "jargon.txt"), "--vocab", os.path.join(assets, "vocab.txt"),
                    "--output-dir", out, "--prefix", "jargon", "--max-seq-length", str(SEQ),
                    "--max-predictions-per-seq", str(PRED), "--dupe-factor", "2", "--seed", "7"],
                   check=True, stderr=subprocess.DEVNULL)
    return sorted(glob.glob(os.path.join(out, "*.hdf5")))


def digest(files):
    h = hashlib.sha256()
    for f in files:
        with h5py.File(f, "r") as d:
            for k in sorted(d):
                h.update(k.encode())
                h.update(d[k][...].tobytes())
    return h.hexdigest()


with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
    files = preprocess(a)
    names = [os.path.basename(f) for f in files]
    assert any("train" in n for n in names) and any("test" in n for n in names), names
    masked = kept = replaced = rows = random_next = 0
    for f in files:
        with h5py.File(f, "r") as d:
            ids, mask, seg = d["input_ids"][...], d["input_mask"][...], d["segment_ids"][...]
            pos, mids, nsl = d["masked_lm_positions"][...], d["masked_lm_ids"][...], d["next_sentence_labels"][...]
            assert ids.shape[1] == SEQ and pos.shape[1] == PRED and nsl.shape == (ids.shape[0],), f
            assert ids.dtype == np.int32 and mask.dtype == np.int8, (ids.dtype, mask.dtype)
            for r in range(ids.shape[0]):
                n = int(mask[r].sum())
                assert (mask[r][:n] == 1).all() and (mask[r][n:] == 0).all() and (ids[r][n:] == 0).all()
                seps = np.nonzero(ids[r][:n] == SEP)[0]
                assert ids[r][0] == CLS and len(seps) == 2 and seps[1] == n - 1, (f, r, ids[r])
                assert (seg[r][:seps[0] + 1] == 0).all() and (seg[r][seps[0] + 1:n] == 1).all(), (f, r)
                k = int((pos[r] != 0).sum())
                assert (pos[r][k:] == 0).all() and (np.diff(pos[r][:k]) > 0).all(), (f, r, pos[r])
                assert k == min(PRED, max(1, int(round(n * 0.15)))), (f, r, k, n)
                at = pos[r][:k]
                assert not np.isin(at, [0, seps[0], seps[1]]).any(), (f, r)
                now = ids[r][at]
                masked += int((now == MASK).sum())
                kept += int((now == mids[r][:k]).sum())
                replaced += int(((now != MASK) & (now != mids[r][:k])).sum())
            rows += ids.shape[0]
            random_next += int(nsl.sum())
    total = masked + kept + replaced
    shares = (masked / total, kept / total, replaced / total)
    print("rows %d, predictions %d: [MASK] %.3f, unchanged %.3f, random %.3f; random next %.3f"
          % (rows, total, *shares, random_next / rows))
    assert abs(shares[0] - 0.8) < 0.02 and abs(shares[1] - 0.1) < 0.02 and abs(shares[2] - 0.1) < 0.02, shares
    assert abs(random_next / rows - 0.5) < 0.03, random_next / rows
    assert digest(files) == digest(preprocess(b)), "the same seed must give the same shards"
print("bert_preprocess recipe: ok")
