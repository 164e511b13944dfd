"""One rank of the hetseq-eval check (tests/python/test_checkpoint.py runs it under torchrun):
    eval_worker.py DATA_DIR CHECKPOINT HIDDEN UPDATES [sharded]
trains the MNIST task's model (mnist_net.py) on DATA_DIR's train split for UPDATES updates with unequal batches
and saves CHECKPOINT for hetseq-eval; with `sharded`, Adam's state is sharded over the ranks (budgets 1:3)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import hetseq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mnist_net import MnistNet, load_split, pixel_stats, read_idx  # noqa: E402

data, path, hidden, updates = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sharded = sys.argv[5:] == ["sharded"]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(1)
stats = pixel_stats(read_idx(os.path.join(data, "train-images-idx3-ubyte")))
train_x, train_y = load_split(data, "train", stats)
model = MnistNet(hidden)
ddp = hetseq.DistributedDataParallel(model, seed=1)
if sharded:
    optimizer = hetseq.ShardedOptimizer(torch.optim.Adam, model.parameters(), memory_budget=[1 << 20, 3 << 20][rank],
                                        lr=2e-3)
else:
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
plan = hetseq.data.Plan(len(train_y), [24, 40][:dist.get_world_size()], seed=1)
for update in plan.updates(rank):
    optimizer.zero_grad()
    with ddp.update(plan.micro_batches, samples=sum(map(len, update))) as u:
        for idx in update:
            u.backward(F.nll_loss(model(train_x[idx]), train_y[idx], reduction="sum"), len(idx))
    optimizer.step()
    if ddp.num_updates == updates:
        break
hetseq.checkpoint.save(path, ddp, optimizer, plan, task="mnist", options=f"--hidden-units {hidden}")
dist.destroy_process_group()
