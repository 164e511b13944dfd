"""One rank of the Python extension's checks (tests/python/test_ddp.py runs it under torchrun):
    ddp_worker.py SCENARIO OUT_DIR
It trains a small model with hetseq.DistributedDataParallel and writes its weights to OUT_DIR/rank<R>.pt, with
those of one process that trained on every rank's samples together (the oracle) on rank 0."""
import gc
import os
import sys

import torch
import torch.distributed as dist

import hetseq
from ranks import backward_update

scenario, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
batch_sizes = [7, 13, 29][:world]
update_freqs = [1, 3, 2][:world] if scenario == "update_freqs" else None
DATASET = 600


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


g = torch.Generator().manual_seed(7)
xs, ys = torch.randn(DATASET, 10, generator=g), torch.randint(0, 3, (DATASET,), generator=g)
loss_sum = torch.nn.CrossEntropyLoss(reduction="sum")
model = make_model()
group = dist.new_group(list(range(world))) if scenario == "new_group" else None
shared_memory = "off" if scenario == "gloo" else "auto"
if scenario == "stock_ddp":  # the negative control: PyTorch's DDP with each rank's mean loss
    ddp = torch.nn.parallel.DistributedDataParallel(model)
else:
    ddp = hetseq.DistributedDataParallel(model, process_group=group, shared_memory=shared_memory)
# update_freqs trains with plain SGD, whose step is the gradient itself: a wrong divisor (samples times the world
# size, say) moves the weights, where Adam's step would hide a constant factor.
def make_optimizer(params):
    if scenario == "update_freqs":
        return torch.optim.SGD(params, lr=0.05)
    return torch.optim.Adam(params, lr=0.01)


optimizer = make_optimizer(model.parameters())
plan = hetseq.data.Plan(DATASET, batch_sizes, update_freqs, seed=3)
updates = 0
for update in plan.updates(rank):
    optimizer.zero_grad()
    if scenario == "stock_ddp":
        idx = update[0]
        (loss_sum(ddp(xs[idx]), ys[idx]) / max(len(idx), 1)).backward()
    else:
        # With `samples` the sum over the ranks travels during backward; the update_freqs case counts afterwards.
        samples = None if scenario == "update_freqs" else sum(len(idx) for idx in update)
        backward_update(ddp, plan.micro_batches, update, lambda idx: loss_sum(model(xs[idx]), ys[idx]), samples)
    optimizer.step()
    updates += 1
# Collectives of torch.distributed on the same group still work after hetseq's updates.
t = torch.full((1,), float(rank))
dist.all_reduce(t, group=group)
dist.barrier(group=group)
assert t.item() == sum(range(world)), t
torch.save({"params": [p.detach().clone() for p in model.parameters()], "updates": updates,
            "shared_memory": getattr(ddp, "gradients_in_shared_memory", None)}, os.path.join(out, f"rank{rank}.pt"))
if rank == 0:  # the oracle: one process, every update's samples of all ranks together, the mean loss
    oracle = make_model()
    opt = make_optimizer(oracle.parameters())
    plans = [list(plan.updates(r)) for r in range(world)]
    for u in range(len(plans[0])):
        idx = [i for r in range(world) for mb in plans[r][u] for i in mb]
        opt.zero_grad()
        (loss_sum(oracle(xs[idx]), ys[idx]) / len(idx)).backward()
        opt.step()
    torch.save({"params": [p.detach().clone() for p in oracle.parameters()]}, os.path.join(out, "oracle.pt"))
# PyTorch's DDP (stock_ddp) holds the process group in its C++ reducer: dropped first, so that destroying the group
# joins Gloo's worker threads now, not in the interpreter's finalization, where one releasing a Python tensor
# aborts the process (Note [Process groups at exit], python/src/bindings.h: seen once in CI on this scenario).
del ddp
gc.collect()
dist.destroy_process_group()
