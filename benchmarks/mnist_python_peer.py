#!/usr/bin/env python3
"""The PyTorch (Python API) peer of `hetseq-train --task mnist`, for throughput comparisons.

Trains HetSeq's MNISTNet on the IDX files of MNIST or Fashion-MNIST exactly the way hetseq does it, but in
plain PyTorch, and prints one JSON line:

    {"samples_per_s": ..., "updates": ..., "seconds": ..., "samples": ..., ...}

What is the same as hetseq (see tasks/mnist/ and hetseq/train/controller.cpp):
  - model: conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max_pool 2, Dropout2d(0.25), flatten,
    fc 9216->128, ReLU, Dropout(0.5), fc 128->10, log_softmax; PyTorch's default initialisation;
  - data: the train split read from <data>/train-{images-idx3,labels-idx1}-ubyte[.gz], pixels scaled to [0, 1]
    and normalised by the mean and (population) standard deviation of all train pixels;
  - batches of --batch-size samples (default 64) drawn from a permutation of the split drawn once per epoch;
  - loss: nll_loss with reduction "sum", gradients divided by the batch's sample count (= the mean loss);
  - optimizer: Adam, lr 0.001, betas (0.9, 0.999), eps 1e-8, no weight decay (torch.optim.Adam, which
    places eps after the bias correction of the second moment; hetseq's fairseq-style Adam places it
    before; the arithmetic per step is the same size);
  - one intra-op thread (torch.set_num_threads(--threads), default 1).

What is timed: from the start of the first update (taking its batch from the pre-normalised tensor
included) to the end of the last optimizer step, the span hetseq's `wps` covers (its epoch meters are
reset after the epoch's shuffle, just before the first update). Reading and normalising the files, building
the model and drawing the permutation happen before; nothing is printed during the timed span. The JSON also
gives the CPU seconds of the span and its minor page faults per update (memory the allocator got afresh
from the kernel, see docs/BENCHMARKS.md).

--bookkeeping adds, per update, what hetseq's controller does besides the plain training step: reading the
loss back (loss.item()), counting correct predictions (argmax/eq/sum/item), the gradient norm in float64
(norm per gradient, stack, norm, item), zero_grad(set_to_none=False) and reseeding the generator. It is off by
default: the peer is the loop a PyTorch user would write; the flag exists to tell hetseq's per-update
bookkeeping from the rest when the two differ.
"""

import argparse
import gzip
import json
import os
import resource
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    """An IDX file (plain or .gz) as a numpy uint8 array shaped by its header."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise SystemExit(f"{path}: too short for an IDX header ({len(data)} bytes)")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    count = int(np.prod(dims)) if dims else 0
    offset = 4 + 4 * ndim
    if len(data) - offset != count:
        raise SystemExit(f"{path}: header says {dims} ({count} bytes) but {len(data) - offset} bytes follow")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def find_file(data_dir, base):
    for name in (base, base + ".gz"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise SystemExit(f"--data {data_dir}: no {base} or {base}.gz")


class MNISTNet(nn.Module):
    """HetSeq's MNISTNet (hetseq/tasks/mnist, the PyTorch MNIST example's network)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="directory with the IDX files")
    ap.add_argument("--max-update", type=int, default=300, help="number of updates to time")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (intra-op threads)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bookkeeping", action="store_true",
                    help="also do hetseq's per-update extras (loss/accuracy read-back, fp64 grad norm, ...)")
    args = ap.parse_args()
    if args.max_update < 1 or args.batch_size < 1 or args.threads < 1:
        raise SystemExit("--max-update, --batch-size and --threads must be >= 1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    images = read_idx(find_file(args.data, "train-images-idx3-ubyte"))  # [N, 28, 28] uint8
    labels = read_idx(find_file(args.data, "train-labels-idx1-ubyte"))  # [N] uint8
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != (images.shape[0],):
        raise SystemExit(f"unexpected IDX shapes: images {images.shape}, labels {labels.shape}")
    # Mean and population std of all train pixels in [0, 1], in float64 (hetseq: exact histogram).
    pixels = images.astype(np.float64) / 255.0
    mean, std = float(pixels.mean()), float(pixels.std())
    data = torch.from_numpy(((pixels - mean) / std).astype(np.float32)).unsqueeze(1).contiguous()  # [N,1,28,28]
    target = torch.from_numpy(labels.astype(np.int64))  # [N]
    del pixels
    n = data.shape[0]

    model = MNISTNet()
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)
    params = [p for p in model.parameters()]
    generator = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(n, generator=generator)
    pos = 0
    samples = 0
    loss_sum = 0.0
    correct = 0

    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu0 = time.process_time()
    start = time.perf_counter()
    for update in range(args.max_update):
        if pos >= n:  # next epoch: a fresh permutation (drawn inside the timed span, as rarely as hetseq does)
            perm = torch.randperm(n, generator=generator)
            pos = 0
        index = perm[pos : pos + args.batch_size]
        pos += args.batch_size
        x = data.index_select(0, index)
        y = target.index_select(0, index)
        bs = x.shape[0]

        if args.bookkeeping:
            torch.manual_seed(args.seed + update)
            optimizer.zero_grad(set_to_none=False)
        else:
            optimizer.zero_grad()
        log_probs = model(x)
        loss = F.nll_loss(log_probs, y, reduction="sum")
        if args.bookkeeping:
            loss_sum += loss.detach().item()
            correct += int(log_probs.argmax(1).eq(y).sum().item())
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.grad.div_(bs)
            if args.bookkeeping:
                gnorm = torch.stack([p.grad.detach().to(torch.float64).norm() for p in params]).norm().item()
        optimizer.step()
        samples += bs
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0

    out = {
        "samples_per_s": samples / seconds,
        "updates": args.max_update,
        "seconds": seconds,
        "samples": samples,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "bookkeeping": args.bookkeeping,
        "final_loss": loss.item() / bs,
        "cpu_seconds": cpu_seconds,
        "minor_faults_per_update": faults / args.max_update,
    }
    if args.bookkeeping:
        out["mean_loss"] = loss_sum / samples
        out["accuracy"] = 100.0 * correct / samples
        out["last_gnorm"] = gnorm
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
