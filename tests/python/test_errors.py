"""hetseq.DistributedDataParallel's error paths, as real ranks: an exception inside `with ddp.update(...)` leaves
the wrapper refusing the next update with a hetseq.UsageError until recover(), after which training goes on exactly;
a lost peer arrives as hetseq.PeerError, over Gloo and over shared memory."""
import os
import socket
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ranks import torchrun  # noqa: E402

WORKER = os.path.join(HERE, "errors_worker.py")


def test_an_exception_in_the_body_then_recover_trains_as_if_the_update_was_left_out(tmp_path):
    torchrun(2, WORKER, "recover", tmp_path)
    for r in range(2):
        saved = torch.load(tmp_path / f"recover{r}.pt")
        assert saved["updates"] > 5
        for i, (a, b) in enumerate(zip(saved["recovered"], saved["reference"])):
            assert torch.equal(a, b), f"rank {r}, parameter {i}: differs by {(a - b).abs().max().item():.3g}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("shared_memory", ["off", "auto"])
def test_a_lost_peer_arrives_as_peer_error(shared_memory):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    ranks = [subprocess.Popen([sys.executable, WORKER, "lost", str(r), str(port), shared_memory], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for r in range(2)]
    try:
        out0, err0 = ranks[0].communicate(timeout=90)
    finally:
        for p in ranks:
            if p.poll() is None:
                os.killpg(p.pid, 9)
        ranks[1].communicate()
    assert ranks[1].returncode == 3
    assert "PEER_ERROR" in out0, f"rank 0's stdout:\n{out0}\nstderr:\n{err0[-4000:]}"
    assert ranks[0].returncode == 0, err0[-4000:]
