"""One rank of the error-path checks (tests/python/test_errors.py):
    errors_worker.py recover OUT_DIR        (under torchrun, 2 ranks)
Both ranks raise inside `with ddp.update(...)` at update 4, after its backward pass; the next update() must
raise a hetseq.UsageError saying so; recover() on both ranks; the run goes on. A run that never raised and
skipped the same samples must end with the same weights, bit for bit (two ranks: one rounding per sum).
    errors_worker.py lost RANK PORT SHARED_MEMORY   (plain processes, env rendezvous on 127.0.0.1:PORT)
Rank 1 leaves abruptly after 2 updates; rank 0 trains on and must get a hetseq.PeerError: it prints
"PEER_ERROR <message>" and exits 0, anything else exits 1."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import hetseq

DATASET = 240


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    g = torch.Generator().manual_seed(7)
    return model, torch.randn(DATASET, 10, generator=g), torch.randint(0, 3, (DATASET,), generator=g)


loss_sum = torch.nn.CrossEntropyLoss(reduction="sum")


def train(raise_at, skip_at):
    """Plain SGD over a plan of batches 7 and 13; update `raise_at` raises after its backward pass (and is then
    recovered from), update `skip_at` is left out without raising. Returns the parameters."""
    rank = dist.get_rank()
    model, xs, ys = model_and_data()
    ddp = hetseq.DistributedDataParallel(model, shared_memory="off")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = hetseq.data.Plan(DATASET, [7, 13], seed=3)
    for k, update in enumerate(plan.updates(rank)):
        if k == skip_at:
            continue
        optimizer.zero_grad()
        idx = update[0]
        if k == raise_at:
            try:
                with ddp.update(1, samples=len(idx)) as u:
                    u.backward(loss_sum(model(xs[idx]), ys[idx]), len(idx))
                    raise ValueError("the loop's own bug")
            except ValueError:
                pass
            else:
                sys.exit("the body's ValueError did not reach the caller")
            try:
                with ddp.update(1) as u:
                    pass
            except hetseq.UsageError as e:
                text = str(e)
                assert "the previous one ended with an exception (ValueError: the loop's own bug)" in text, text
                assert "Call recover() on every rank" in text, text
            else:
                sys.exit("update() after an unfinished update did not raise hetseq.UsageError")
            ddp.recover()
            continue
        with ddp.update(1, samples=len(idx)) as u:
            u.backward(loss_sum(model(xs[idx]), ys[idx]), len(idx))
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()], ddp.num_updates


def recover(out):
    dist.init_process_group("gloo")
    recovered, n1 = train(raise_at=4, skip_at=None)
    reference, n2 = train(raise_at=None, skip_at=4)
    assert n1 == n2, (n1, n2)
    torch.save({"recovered": recovered, "reference": reference, "updates": n1},
               os.path.join(out, f"recover{dist.get_rank()}.pt"))
    dist.destroy_process_group()


def lost(rank, port, shared_memory):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    model, xs, ys = model_and_data()
    ddp = hetseq.DistributedDataParallel(model, shared_memory=shared_memory, timeout_s=15)
    plan = hetseq.data.Plan(DATASET, [7, 13], seed=3)
    try:
        for k, update in enumerate(plan.updates(rank)):
            if rank == 1 and k == 2:
                os._exit(3)  # gone, without a word to its peer
            idx = update[0]
            with ddp.update(1, samples=len(idx)) as u:
                u.backward(loss_sum(model(xs[idx]), ys[idx]), len(idx))
    except hetseq.PeerError as e:
        print("PEER_ERROR", str(e).splitlines()[0], flush=True)
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 (the test reads the type)
        print("OTHER_ERROR", type(e).__name__, str(e).splitlines()[0] if str(e) else "", flush=True)
        os._exit(1)
    print("NO_ERROR", flush=True)
    os._exit(1)


if sys.argv[1] == "recover":
    recover(sys.argv[2])
else:
    lost(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
