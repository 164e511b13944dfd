#!/usr/bin/env python3
"""One rank of the PyTorch (Python API) DistributedDataParallel peer of distributed `hetseq-train --task mnist`.

Start one process per rank (benchmarks/mnist_distributed_throughput.sh does). Each trains HetSeq's MNISTNet
(mnist_python_peer.MNISTNet, the same network, data and normalisation as the single-process peer) with
torch.nn.parallel.DistributedDataParallel over Gloo, and rank 0 prints one JSON line:

    {"samples_per_s": ..., "updates": ..., "seconds": ..., "samples": ..., "batch_sizes": [...], ...}

Per update, rank r takes the next b_r samples of the epoch's permutation after those of ranks 0..r-1 (the
same data plan as hetseq: every sample once per epoch, unequal batches allowed; --batch-sizes b0,b1,...).
Its summed loss is multiplied by W / (b_0 + ... + b_{W-1}) before backward, so that DDP's average over the
W ranks gives the gradient of the mean loss over the update's samples, as hetseq's weighted averaging does.
DDP runs with its defaults (25 MiB buckets, overlapped allreduces). Adam lr 0.001, no clipping.

Timed span: from a barrier just before the first update to the end of the last optimizer step on rank 0
(its last update waits for every rank's gradients), the span hetseq's `wps` covers.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mnist_python_peer import MNISTNet, find_file, read_idx  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="directory with the IDX files")
    ap.add_argument("--init-method", required=True, help="torch.distributed init method, e.g. file:///tmp/x")
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--batch-sizes", required=True, help="one batch size per rank, comma-separated")
    ap.add_argument("--max-update", type=int, default=200, help="number of updates to time")
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (intra-op threads)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--comm-hook", choices=("none", "fp16", "bf16", "powersgd"), default="none",
                    help="DDP communication hook (torch.distributed.algorithms.ddp_comm_hooks)")
    ap.add_argument("--powersgd-rank", type=int, default=1, help="matrix_approximation_rank of PowerSGD")
    ap.add_argument("--powersgd-start-update", type=int, default=100, help="start_powerSGD_iter of PowerSGD")
    args = ap.parse_args()
    sizes = [int(v) for v in args.batch_sizes.split(",")]
    if len(sizes) != args.world_size or min(sizes) < 1:
        raise SystemExit(f"--batch-sizes: need {args.world_size} positive sizes, got '{args.batch_sizes}'")
    if not 0 <= args.rank < args.world_size:
        raise SystemExit(f"--rank {args.rank}: not in [0, {args.world_size})")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo", init_method=args.init_method, world_size=args.world_size, rank=args.rank)

    images = read_idx(find_file(args.data, "train-images-idx3-ubyte"))
    labels = read_idx(find_file(args.data, "train-labels-idx1-ubyte"))
    pixels = images.astype(np.float64) / 255.0
    mean, std = float(pixels.mean()), float(pixels.std())
    data = torch.from_numpy(((pixels - mean) / std).astype(np.float32)).unsqueeze(1).contiguous()
    target = torch.from_numpy(labels.astype(np.int64))
    del pixels
    n = data.shape[0]
    total = sum(sizes)
    offset = sum(sizes[: args.rank])
    mine = sizes[args.rank]
    if args.max_update * total > n:
        raise SystemExit(f"--max-update {args.max_update}: at most {n // total} full updates of {total} in one epoch")

    model = torch.nn.parallel.DistributedDataParallel(MNISTNet())  # broadcasts rank 0's parameters
    if args.comm_hook in ("fp16", "bf16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = default_hooks.fp16_compress_hook if args.comm_hook == "fp16" else default_hooks.bf16_compress_hook
        model.register_comm_hook(None, hook)
    elif args.comm_hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=max(2, args.powersgd_start_update))
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)
    generator = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(n, generator=generator)  # the same on every rank
    scale = args.world_size / total

    dist.barrier()
    cpu0 = time.process_time()
    start = time.perf_counter()
    pos = 0
    for _ in range(args.max_update):
        index = perm[pos + offset : pos + offset + mine]
        pos += total
        x = data.index_select(0, index)
        y = target.index_select(0, index)
        optimizer.zero_grad()
        loss = F.nll_loss(model(x), y, reduction="sum")
        (loss * scale).backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu0

    if args.rank == 0:
        print(json.dumps({
            "samples_per_s": args.max_update * total / seconds,
            "updates": args.max_update,
            "seconds": seconds,
            "samples": args.max_update * total,
            "batch_sizes": sizes,
            "world_size": args.world_size,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "cpu_seconds": cpu_seconds,
            "comm_hook": args.comm_hook,
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
