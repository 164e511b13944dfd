"""One rank of the sharded optimizer's checks (tests/python/test_shard.py runs it under torchrun, once, on 3 ranks):
    shard_worker.py OUT_DIR
Budgets 1:1:2 and batches 7/13/29. It writes OUT_DIR/rank<R>.pt with:
- `budget_error`: the message of the InputError that a budget of 0 on rank 1 gives on every rank;
- `add_param_group_error`: the UsageError's message for a param group added after construction;
- `exact`: for Adam, AdamW (two param groups) and SGD with momentum, the weights after an epoch of updates with
  hetseq.ShardedOptimizer and with the unsharded torch.optim optimizer, and the sharded one's report;
- `resume`: the weights of a sharded run (Adam, StepLR, dropout) of two epochs never stopped, and of the same run
  stopped after update 10 and resumed from its checkpoint as it was, on other budgets, and unsharded; and the
  optimizer entries of the sharded run's checkpoint and of the unsharded run's stopped at the same update."""
import os
import sys

import torch
import torch.distributed as dist

import hetseq
from ranks import backward_update, train_plan

out = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
BUDGETS = [1 << 20, 1 << 20, 2 << 20]  # [rank] 1:1:2
DATASET = 300
g = torch.Generator().manual_seed(7)
xs, ys = torch.randn(DATASET, 10, generator=g), torch.randint(0, 3, (DATASET,), generator=g)
loss_sum = torch.nn.CrossEntropyLoss(reduction="sum")
result = {}

try:  # every rank learns rank 1's budget and stops alike
    hetseq.ShardedOptimizer(torch.optim.Adam, [torch.zeros(100)], memory_budget=[4096, 0, 4096][rank])
except hetseq.InputError as e:
    result["budget_error"] = str(e)


def make_model(dropout=0.0):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(32, 3))


def param_groups(model, two):
    """One group, or the weights and the biases apart with their own options."""
    if not two:
        return model.parameters()
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights}, {"params": biases, "lr": 0.02, "weight_decay": 0.0}]


def make_optimizer(model, cls, kwargs, budgets, two_groups=False):
    if budgets is None:
        return cls(param_groups(model, two_groups), **kwargs)
    return hetseq.ShardedOptimizer(cls, param_groups(model, two_groups), memory_budget=budgets[rank], **kwargs)


def train_epoch(cls, kwargs, budgets, two_groups):
    model = make_model()
    ddp = hetseq.DistributedDataParallel(model, shared_memory="off", bucket_cap_mb=0.001)
    optimizer = make_optimizer(model, cls, kwargs, budgets, two_groups)
    plan = hetseq.data.Plan(DATASET, [7, 13, 29], seed=3)
    for update in plan.updates(rank):
        optimizer.zero_grad()
        backward_update(ddp, plan.micro_batches, update, lambda idx: loss_sum(model(xs[idx]), ys[idx]),
                        samples=sum(map(len, update)))
        optimizer.step()
    report = optimizer.report(print_json=True) if budgets is not None else None
    return [p.detach().clone() for p in model.parameters()], ddp.num_updates, report, optimizer


result["exact"] = {}
try:  # after construction, a new group would be out of the plan
    train_epoch(torch.optim.SGD, {"lr": 0.1}, BUDGETS, False)[3].add_param_group({"params": [torch.zeros(3)]})
except hetseq.UsageError as e:
    result["add_param_group_error"] = str(e)
for name, cls, kwargs, two_groups in [("Adam", torch.optim.Adam, {"lr": 0.01}, False),
                                      ("AdamW", torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}, True),
                                      ("SGD", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, False)]:
    sharded, updates, report, _ = train_epoch(cls, kwargs, BUDGETS, two_groups)
    unsharded, _, _, _ = train_epoch(cls, kwargs, None, two_groups)
    result["exact"][name] = {"sharded": sharded, "unsharded": unsharded, "updates": updates, "report": report}

EPOCHS, STOP = 2, 10
path = os.path.join(out, "checkpoint.pt")


def run(mode, budgets):
    """`full`: two epochs; `stop`: STOP updates, then a checkpoint at `path`; `resume`: from it to the end."""
    model = make_model(dropout=0.3)
    ddp = hetseq.DistributedDataParallel(model, shared_memory="off", bucket_cap_mb=0.001, seed=11)
    optimizer = make_optimizer(model, torch.optim.Adam, {"lr": 0.01}, budgets)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    plan = hetseq.data.Plan(DATASET, [7, 13, 29], seed=3)
    if mode == "resume":
        hetseq.checkpoint.load(path, ddp, optimizer, plan, scheduler)
    train_plan(ddp, optimizer, scheduler, plan, rank, EPOCHS, lambda idx: loss_sum(model(xs[idx]), ys[idx]),
               stop_after=STOP if mode == "stop" else None,
               on_stop=lambda: hetseq.checkpoint.save(path, ddp, optimizer, plan, scheduler))
    return [p.detach().clone() for p in model.parameters()], ddp.num_updates


def optimizer_entries():
    c = hetseq._C.load_checkpoint(path)
    return c.optimizer_name, c.optimizer_options, c.optimizer_state


resume = {"full": run("full", BUDGETS)}
run("stop", None)  # the unsharded run's checkpoint, to compare the files' optimizer entries
resume["unsharded_file"] = optimizer_entries()
resume["stop"] = run("stop", BUDGETS)
resume["sharded_file"] = optimizer_entries()
resume["resume"] = run("resume", BUDGETS)
resume["resume_other_budgets"] = run("resume", [3 << 20, 1 << 20, 1 << 20])
resume["resume_unsharded"] = run("resume", None)
result["resume"] = resume
torch.save(result, os.path.join(out, f"rank{rank}.pt"))
dist.destroy_process_group()
