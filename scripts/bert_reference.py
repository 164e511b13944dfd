#!/usr/bin/env python3
"""Reference outputs of a pretrained BERT from Hugging Face `transformers`, for hetseq's reference check.

Runs transformers' BertModel (fp32, eval mode, eager attention) from a local model directory in Hugging Face's
layout on a fixed batch of sentence pairs of different lengths (padded, with token types) and writes a safetensors
file with the inputs (`input_ids`, `token_type_ids`, `attention_mask`, int64 [B, S]) and the outputs
(`last_hidden_state` [B, S, H], `pooler_output` [B, H]). tests/bert/test_bert_reference.cpp loads the same weights
into hetseq's BertModel and compares (scripts/bert_reference_check.sh runs both).

Usage: bert_reference.py --model DIR --out FILE
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import BertModel

PAIRS = [
    ("The Jargon File is a glossary of hacker slang.", "It was first compiled in 1975."),
    ("A kludge is a clever programming trick intended to solve a particular nasty case in an expedient, if not "
     "clear, manner.", "Often used to repair bugs."),
    ("Hello world.", "Bye."),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="directory with config.json, model.safetensors, tokenizer.json")
    parser.add_argument("--out", required=True, help="safetensors file to write")
    args = parser.parse_args()

    tokenizer = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(PAIRS)
    input_ids = torch.tensor([e.ids for e in encodings], dtype=torch.int64)
    token_type_ids = torch.tensor([e.type_ids for e in encodings], dtype=torch.int64)
    attention_mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.int64)
    assert attention_mask.min() == 0, "the batch must contain padding"

    model = BertModel.from_pretrained(args.model, local_files_only=True, attn_implementation="eager").float()
    model.eval()
    with torch.no_grad():
        out = model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    save_file({
        "input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
        "last_hidden_state": out.last_hidden_state.contiguous(), "pooler_output": out.pooler_output.contiguous(),
    }, args.out)
    print(f"[bert_reference] {args.out}: batch {list(input_ids.shape)}, hidden {list(out.last_hidden_state.shape)}")


if __name__ == "__main__":
    main()
