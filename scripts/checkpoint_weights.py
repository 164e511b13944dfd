#!/usr/bin/env python3
"""Reads the model weights of a hetseq checkpoint in Python (the torch version that hetseq was built with).

    checkpoint_weights.py CHECKPOINT [--out STATE_DICT.pt] [--summary]

A hetseq checkpoint (checkpoint_last.pt, checkpoint_best.pt, ...) is an archive in torch.save's format
holding a dict; its "model" entry is the model's state dict (parameter and buffer names as the C++
modules register them, e.g. "conv1.weight"). In your own code:

    import torch
    ckpt = torch.load("checkpoints/checkpoint_last.pt", weights_only=True, map_location="cpu")
    state_dict = ckpt["model"]            # {name: tensor}
    ckpt["extra_state"]["num_updates"]    # also: epoch, offset, data_plan, best, meters
    ckpt["optimizer"]["state"]            # hetseq's optimizer buffers, by "param.{i}.{buffer}"

--out writes the state dict alone with torch.save (load it with model.load_state_dict(torch.load(...))).
--summary prints {name: {"shape": [...], "sum": float}} as JSON (the tests compare it with the C++ side).
"""

import argparse
import json
import sys

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--out", help="write the model's state dict here with torch.save")
    ap.add_argument("--summary", action="store_true", help="print each tensor's shape and sum as JSON")
    args = ap.parse_args()
    try:
        ckpt = torch.load(args.checkpoint, weights_only=True, map_location="cpu")
    except Exception as e:  # the archive reader's own message says what is wrong
        sys.exit(f"{args.checkpoint}: cannot be read as a checkpoint: {e}")
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        sys.exit(f"{args.checkpoint}: not a hetseq checkpoint (no 'model' entry)")
    state_dict = ckpt["model"]
    if args.out:
        torch.save(state_dict, args.out)
    if args.summary:
        print(json.dumps({k: {"shape": list(v.shape), "sum": v.double().sum().item()} for k, v in state_dict.items()}))
    elif not args.out:
        extra = ckpt["extra_state"]
        print(f"{args.checkpoint}: {len(state_dict)} tensors, {sum(v.numel() for v in state_dict.values())} values; "
              f"{extra['num_updates']} updates, epoch {extra['epoch']} at sample {extra['offset']}; "
              f"written by torch {ckpt['torch_version']}")


if __name__ == "__main__":
    main()
