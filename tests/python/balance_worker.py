"""One rank of the balancer check (tests/python/test_balance.py runs it under torchrun):
    balance_worker.py OUT_DIR
Two ranks with batch sizes 24 and 40 record compute times of 1 and 3 ms a sample (rank 1 is three times slower),
replan after 4 updates, and write the sample indices each took per update to OUT_DIR/rank<R>.pt."""
import os
import sys

import torch
import torch.distributed as dist

import hetseq

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
plan = hetseq.data.Plan(1000, [24, 40], seed=2)
per_sample_s = [0.001, 0.003][rank]
updates, replans = [], []
for update in plan.updates(rank, 1):
    updates.append([i for micro_batch in update for i in micro_batch])
    plan.record(per_sample_s * len(updates[-1]), len(updates[-1]))
    if len(updates) % 4 == 0:
        replans.append(plan.replan())
torch.save({"updates": updates, "replans": replans, "shares": plan.shares}, os.path.join(out, f"rank{rank}.pt"))
dist.destroy_process_group()
