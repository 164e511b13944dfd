"""One rank of benchmarks/python_ddp.sh: MNIST's convolutional net on Fashion-MNIST-shaped batches, trained from a
Python loop with hetseq.DistributedDataParallel or torch's DistributedDataParallel; rank 0 prints one JSON line
with the median seconds per update after the warm-up, and the median seconds spent leaving hetseq's update
(the reduction's end, the sample count's allreduce and the division: what the binding adds over DDP's backward).
    python_ddp_worker.py --system hetseq|torch --batch-sizes 64,64 --updates 60 --warmup 10"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import hetseq

parser = argparse.ArgumentParser()
parser.add_argument("--system", choices=["hetseq", "torch"], required=True)
parser.add_argument("--batch-sizes", default="64,64")
parser.add_argument("--updates", type=int, default=60)
parser.add_argument("--warmup", type=int, default=10)
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
torch.manual_seed(1)
batch = [int(b) for b in args.batch_sizes.split(",")][rank]
model = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 5),
                            torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(512, 128),
                            torch.nn.ReLU(), torch.nn.Linear(128, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
wrapped = hetseq.DistributedDataParallel(model) if args.system == "hetseq" else \
    torch.nn.parallel.DistributedDataParallel(model)
times, leaving = [], []
for step in range(args.warmup + args.updates):
    dist.barrier()
    start = time.perf_counter()
    optimizer.zero_grad()
    if args.system == "hetseq":
        with wrapped.update(samples=batch) as u:
            u.backward(F.cross_entropy(model(x), y, reduction="sum"), batch)
            left = time.perf_counter()
        leaving.append(time.perf_counter() - left)
    else:
        F.cross_entropy(wrapped(x), y).backward()
    optimizer.step()
    times.append(time.perf_counter() - start)
if rank == 0:
    print(json.dumps({"system": args.system, "ranks": world, "batch_sizes": args.batch_sizes,
                      "s_per_update": statistics.median(times[args.warmup:]),
                      "leave_update_s": statistics.median(leaving[args.warmup:]) if leaving else None,
                      "shared_memory": getattr(wrapped, "gradients_in_shared_memory", None)}))
dist.destroy_process_group()
