"""One rank of the checkpoint checks (tests/python/test_checkpoint.py runs it under torchrun):
    resume_worker.py MODE OUT_DIR [STOP [PLACE]]
MODE `full+stop` trains two epochs (`full`), then from the start again STOP updates and saves
OUT_DIR/checkpoint.pt (`stop`), at the bottom of the loop's body or (PLACE `top`) at the top of the next one; `resume`, in processes of its own, loads it and trains to the end of the two
epochs. Each writes its weights, the update count and the plan's position to OUT_DIR/<mode><rank>.pt. The model has dropout (drawn in every update) and the loop an LR schedule; three ranks with
unequal batches, over Gloo with small buckets (Note [Resume from Python])."""
import os
import sys

import torch
import torch.distributed as dist

import hetseq
from ranks import train_plan

mode, out = sys.argv[1], sys.argv[2]
stop = int(sys.argv[3]) if len(sys.argv) > 3 else 0
at_top = len(sys.argv) > 4 and sys.argv[4] == "top"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
EPOCHS, DATASET = 2, 300
g = torch.Generator().manual_seed(7)
xs, ys = torch.randn(DATASET, 10, generator=g), torch.randint(0, 3, (DATASET,), generator=g)
loss_sum = torch.nn.CrossEntropyLoss(reduction="sum")
path = os.path.join(out, "checkpoint.pt")


def run(mode):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(32, 3))
    ddp = hetseq.DistributedDataParallel(model, shared_memory="off", bucket_cap_mb=0.001, seed=11)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    plan = hetseq.data.Plan(DATASET, [7, 13, 29][:world], seed=3)
    if mode == "resume":
        hetseq.checkpoint.load(path, ddp, optimizer, plan, scheduler)
    train_plan(ddp, optimizer, scheduler, plan, rank, EPOCHS, lambda idx: loss_sum(model(xs[idx]), ys[idx]),
               stop_after=stop if mode == "stop" else None,
               on_stop=lambda: hetseq.checkpoint.save(path, ddp, optimizer, plan, scheduler), stop_at_top=at_top)
    torch.save({"params": [p.detach().clone() for p in model.parameters()], "updates": ddp.num_updates,
                "position": plan.position()}, os.path.join(out, f"{mode}{rank}.pt"))


for m in (["full", "stop"] if mode == "full+stop" else [mode]):  # the resumed run: a process of its own
    run(m)
dist.destroy_process_group()
