"""hetseq.DistributedDataParallel from a Python loop, as real ranks under torchrun: exact sample weighting with
unequal batches and update-freqs, shared memory and Gloo alike, on the default group and a new group, under
TORCH_DISTRIBUTED_DEBUG=DETAIL, with torch.distributed's own collectives working after it; and the negative
control, stock DDP with each rank's mean loss, far from exact."""
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import torchrun  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ddp_worker.py")


def run_ranks(tmp_path, scenario, nproc=3, env=None):
    """Runs ddp_worker.py SCENARIO on `nproc` ranks; returns each rank's result and rank 0's oracle."""
    stderr = torchrun(nproc, WORKER, scenario, tmp_path, env=env)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(nproc)]
    return ranks, torch.load(tmp_path / "oracle.pt"), stderr


def max_difference(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


@pytest.mark.parametrize("scenario", ["default", "update_freqs"])
def test_unequal_batches_train_the_model_of_one_process(tmp_path, scenario):
    ranks, oracle, _ = run_ranks(tmp_path, scenario)
    assert ranks[0]["updates"] > 3
    for r, result in enumerate(ranks):
        assert max_difference(result["params"], oracle["params"]) < 1e-5, f"rank {r} ({scenario})"
        assert max_difference(result["params"], ranks[0]["params"]) == 0, f"rank {r} differs from rank 0"


def test_stock_ddp_with_mean_losses_is_far_from_it(tmp_path):
    ranks, oracle, _ = run_ranks(tmp_path, "stock_ddp")
    assert max_difference(ranks[0]["params"], oracle["params"]) > 1e-3


def test_shared_memory_and_gloo_give_the_same_weights(tmp_path):
    # Two ranks: a sum of two terms has one rounding whatever the order, so the bits agree (with three, Gloo's
    # ring adds in another order than the shared-memory sum's rank order).
    (tmp_path / "shm").mkdir()
    (tmp_path / "gloo").mkdir()
    shm, _, _ = run_ranks(tmp_path / "shm", "default", nproc=2)
    gloo, _, _ = run_ranks(tmp_path / "gloo", "gloo", nproc=2)
    assert shm[0]["shared_memory"] is True and gloo[0]["shared_memory"] is False
    assert max_difference(shm[0]["params"], gloo[0]["params"]) == 0


def test_a_new_group_and_the_debug_wrapper(tmp_path):
    ranks, oracle, _ = run_ranks(tmp_path, "new_group", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for result in ranks:
        assert max_difference(result["params"], oracle["params"]) < 1e-5


def test_the_extension_refuses_another_torch():
    import hetseq
    assert hetseq._C.torch_version.split("+")[0] == torch.__version__.split("+")[0]
    code = ("import torch; torch.__version__ = '0.0.1'; import hetseq")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "hetseq was built against torch" in p.stderr and "rebuild it against this torch" in p.stderr


EXIT_SCRIPT = """
import os, sys, torch, torch.distributed as dist
import hetseq
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
model = torch.nn.Linear(4, 2)
ddp = hetseq.DistributedDataParallel(model, shared_memory="off")
torch.optim.Adam(model.parameters(), lr=0.01)  # torch.optim's first optimizer imports torch._dynamo
failed = torch.tensor([0])
dist.all_reduce(failed)
del ddp, failed
dist.destroy_process_group()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print("gloo threads left:", names.count("pt_gloo_runloop"))
"""


def test_destroy_process_group_joins_the_gloo_threads_after_an_optimizer_is_built(tmp_path):
    """A Gloo worker thread left running into the interpreter's finalization aborts the process when it
    releases a tensor Python has seen (seen in CI: "terminate called without an active exception" after a run
    that had finished). torch.optim imports a module whose default arguments hold the default group when it
    is imported after init_process_group; `import hetseq` imports it first (Note [Process groups at exit])."""
    p = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(tmp_path / "rendezvous")], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr
    assert "gloo threads left: 0" in p.stdout, p.stdout + p.stderr
