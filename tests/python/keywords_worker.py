"""One rank of tests/python/test_keywords.py, under torchrun (2 ranks):
    keywords_worker.py OUT_DIR plain     the reducer's and the checkpoint's messages, in a plain Gloo group
    keywords_worker.py OUT_DIR checked   the same group checked by TORCH_DISTRIBUTED_DEBUG=DETAIL (set by the test)
Each case's message (the exception's text, or "NO_ERROR") goes to OUT_DIR/<mode><rank>.json, {case: message}; the
log lines are on stderr, which the test reads from torchrun."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import hetseq


def message(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (the test reads the text)
        cause = f" (cause: {e.__cause__})" if e.__cause__ is not None else ""
        return f"{type(e).__name__}: {e}{cause}"
    return "NO_ERROR"


class HalfUsed(torch.nn.Module):
    """`unused` requires a gradient that no forward gives it."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


def one_update(ddp, x, delay_s=0.0):
    with ddp.update(1, samples=len(x)) as u:
        time.sleep(delay_s)
        u.backward(ddp(x).sum(), len(x))


def plain(rank, out):
    torch.manual_seed(0)
    x = torch.ones(3, 4)
    found = {
        "shared_memory_value": message(lambda: hetseq.DistributedDataParallel(torch.nn.Linear(4, 2),
                                                                              shared_memory="yes")),
        "bucket_cap_mb": message(lambda: hetseq.DistributedDataParallel(torch.nn.Linear(4, 2), bucket_cap_mb=0)),
        "unused_parameter": message(lambda: one_update(hetseq.DistributedDataParallel(HalfUsed(), shared_memory="off"),
                                                       x)),
    }
    # The "[reducer] ... through shared memory (...)" line on rank 0's log, and a checkpoint loaded into a plan of
    # a smaller dataset than the one it was saved over.
    ddp = hetseq.DistributedDataParallel(torch.nn.Linear(4, 2), shared_memory="auto")
    big = hetseq.data.Plan(100, [3, 4], shuffle=False)
    for k, update in enumerate(big.updates(rank)):
        one_update(ddp, x[:len(update[0])])
        if k == 5:
            break
    path = os.path.join(out, "big.pt")
    hetseq.checkpoint.save(path, ddp, plan=big)
    found["checkpoint_plan"] = message(lambda: hetseq.checkpoint.load(path, ddp, plan=hetseq.data.Plan(10, [3, 4])))
    ddp = None
    # Last, as it leaves rank 1 behind: rank 0 waits at most timeout_s for rank 1's bucket in shared memory.
    ddp = hetseq.DistributedDataParallel(torch.nn.Linear(4, 2), shared_memory="on", timeout_s=1)
    found["shared_memory_timeout"] = message(lambda: one_update(ddp, x, delay_s=0 if rank == 0 else 4))
    return found


def checked(rank, out):
    return {
        "shared_memory_on": message(lambda: hetseq.DistributedDataParallel(torch.nn.Linear(4, 2), shared_memory="on")),
        "shared_memory_auto": message(lambda: hetseq.DistributedDataParallel(torch.nn.Linear(4, 2))),
    }


def main():
    out, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    found = {"plain": plain, "checked": checked}[mode](rank, out)
    with open(os.path.join(out, f"{mode}{rank}.json"), "w") as f:
        json.dump(found, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # No collective after the timeout case: the ranks are out of step there.
    os._exit(0)


main()
