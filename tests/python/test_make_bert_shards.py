"""scripts/make_bert_shards.sh, the one command that makes BERT shards of a user's own text (data/README.md):
a corpus of 50 lines becomes HDF5 shards with the six datasets, dtypes and shapes that hetseq-train --task bert
and NVIDIA's BERT read, whose token ids decode back to the corpus; a missing or empty corpus is an error that
names the file."""
import glob
import os
import subprocess

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "make_bert_shards.sh")
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SUBJECTS = ["the cat", "a dog", "my sister", "the old man", "our teacher", "the small bird", "a farmer", "the child"]
VERBS = ["sees", "likes", "finds", "paints", "follows", "carries", "watches"]
OBJECTS = ["a red house", "the green river", "two white boats", "the long road", "a quiet garden", "the tall tree"]
PLACES = ["in the morning", "near the sea", "after school", "on a cold day", "by the window"]


def corpus_documents():
    """Ten documents of four or five sentences: 55 lines with the blank ones."""
    documents, k = [], 0
    for d in range(10):
        sentences = []
        for _ in range(4 + d % 2):
            sentences.append(f"{SUBJECTS[k % len(SUBJECTS)]} {VERBS[k % len(VERBS)]} {OBJECTS[k % len(OBJECTS)]} "
                             f"{PLACES[k % len(PLACES)]} .")
            k += 1
        documents.append(sentences)
    return documents


def write_corpus(path):
    documents = corpus_documents()
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
    return documents


def run_script(*args, cwd=None):
    return subprocess.run(["bash", SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_corpus_becomes_shards_whose_token_ids_decode_back_to_it(tmp_path):
    corpus, out, vocab = tmp_path / "corpus.txt", tmp_path / "shards", tmp_path / "vocab.txt"
    documents = write_corpus(corpus)
    assert 50 <= len(corpus.read_text().splitlines()) <= 60
    words = sorted({w for d in documents for s in d for w in s.split()})
    tokens = SPECIAL + words
    vocab.write_text("".join(t + "\n" for t in tokens))
    seq, pred = 32, 5

    p = run_script(corpus, out, "--vocab", vocab, "--max-seq-length", seq, "--max-predictions-per-seq", pred,
                   "--dupe-factor", 2, "--test-fraction", 0.2)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == str(out)
    names = sorted(os.path.basename(f) for f in glob.glob(str(out / "*")))
    assert names == ["bert_test_0.hdf5", "bert_train_0.hdf5"], names

    # The corpus's documents as token ids, to find every segment of every sequence in.
    text_ids = [" ".join(str(tokens.index(w)) for s in d for w in s.split()) for d in documents]
    cls, sep, mask = (tokens.index(t) for t in ("[CLS]", "[SEP]", "[MASK]"))
    for split in ("train", "test"):
        with h5py.File(out / f"bert_{split}_0.hdf5", "r") as f:
            expected = {"input_ids": ("int32", 2, seq), "input_mask": ("int8", 2, seq),
                        "segment_ids": ("int8", 2, seq), "masked_lm_positions": ("int32", 2, pred),
                        "masked_lm_ids": ("int32", 2, pred), "next_sentence_labels": ("int8", 1, None)}
            assert sorted(f) == sorted(expected)
            n = f["input_ids"].shape[0]
            assert n > 0
            for name, (dtype, dims, width) in expected.items():
                assert f[name].dtype == np.dtype(dtype), (split, name, f[name].dtype)
                assert f[name].shape == ((n, width) if dims == 2 else (n,)), (split, name, f[name].shape)
            data = {name: f[name][()] for name in expected}
        assert set(np.unique(data["next_sentence_labels"])) <= {0, 1}
        for r in range(n):
            length = int(data["input_mask"][r].sum())
            ids = data["input_ids"][r][:length].astype(np.int64)
            assert (data["input_ids"][r][length:] == 0).all()
            # The masked tokens put back: the sequence as the text had it.
            for position, token in zip(data["masked_lm_positions"][r], data["masked_lm_ids"][r]):
                if position > 0:
                    ids[position] = token
            assert ids[0] == cls and ids[-1] == sep and (ids == sep).sum() == 2 and mask not in ids
            a_end = int(np.nonzero(ids == sep)[0][0])
            segments = data["segment_ids"][r][:length]
            assert (segments[:a_end + 1] == 0).all() and (segments[a_end + 1:] == 1).all()
            # A and B are each a run of one document's tokens (B of another one when it is random).
            for segment in (ids[1:a_end], ids[a_end + 1:-1]):
                assert len(segment) > 0
                assert all(tokens[t] in words for t in segment), [tokens[t] for t in segment]
                span = " ".join(str(t) for t in segment)
                assert any(f" {span} " in f" {text} " for text in text_ids), [tokens[t] for t in segment]


def test_the_default_vocabulary_is_bert_base_uncased(tmp_path):
    corpus, out = tmp_path / "corpus.txt", tmp_path / "shards"
    documents = write_corpus(corpus)
    p = run_script(corpus, out, "--max-seq-length", 32, "--max-predictions-per-seq", 5, "--dupe-factor", 1)
    assert p.returncode == 0, p.stderr
    vocab_path = os.path.join(os.environ.get("HETSEQ_HOME", os.path.expanduser("~/.cache/hetseq")), "bert", "vocab.txt")
    with open(vocab_path, encoding="utf-8") as f:
        vocab = f.read().splitlines()
    assert len(vocab) == 30522  # configs/bert-*.json's vocab_size
    words = {w for d in documents for s in d for w in s.split()}
    with h5py.File(out / "bert_train_0.hdf5", "r") as f:
        ids, mask = f["input_ids"][()], f["input_mask"][()]
        positions, masked = f["masked_lm_positions"][()], f["masked_lm_ids"][()]
    for r in range(len(ids)):
        row = ids[r][:int(mask[r].sum())].copy()
        for position, token in zip(positions[r], masked[r]):
            if position > 0:
                row[position] = token
        decoded = [vocab[t] for t in row]
        assert decoded[0] == "[CLS]" and decoded[-1] == "[SEP]"
        assert {t for t in decoded if t not in ("[CLS]", "[SEP]")} <= words, decoded


def test_a_missing_or_empty_corpus_is_an_error_that_names_the_file(tmp_path):
    missing = tmp_path / "no-such-corpus.txt"
    p = run_script(missing, tmp_path / "out")
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert str(missing) in p.stderr and "no such file" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()

    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    p = run_script(empty, tmp_path / "out")
    assert p.returncode == 3 and str(empty) in p.stderr and "empty" in p.stderr, p.stderr

    p = run_script(tmp_path / "only-one-argument.txt")
    assert p.returncode == 2 and "usage:" in p.stderr, p.stderr
