"""hetseq.checkpoint from a Python loop, as real ranks under torchrun: a run stopped and resumed from its checkpoint
ends with the weights of the run never stopped, bit for bit; a checkpoint written from Python is hetseq-train's
format (a sharded optimizer's too), which hetseq-eval evaluates (its figures equal Python's) and torch.load reads; a
damaged file is a hetseq.InputError naming it."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hetseq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mnist_net import MnistNet, load_split, pixel_stats, read_idx  # noqa: E402
from ranks import torchrun  # noqa: E402


@pytest.mark.parametrize("place", ["bottom", "top"])
def test_a_resumed_run_ends_with_the_weights_of_the_run_never_stopped(tmp_path, place):
    # Saved at the bottom of the loop's body after update 10, or at the top of the next one, where the plan has
    # handed out update 11 and the loop has not trained it: the position is that of the updates finished, so
    # both resume at update 11's samples (a position of the updates handed out skipped them).
    worker = os.path.join(HERE, "resume_worker.py")
    torchrun(3, worker, "full+stop", tmp_path, 10, place)  # 7 updates an epoch: the 10th is in the middle of epoch 2
    torchrun(3, worker, "resume", tmp_path)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)  # hetseq-train's format, read by torch
    assert saved["extra_state"]["num_updates"] == 10
    assert (saved["extra_state"]["epoch"], saved["extra_state"]["offset"]) == (2, 3 * (7 + 13 + 29))
    assert saved["optimizer"]["name"] == "torch.optim.Adam"
    assert saved["lr_scheduler"]["name"] == "torch.optim.lr_scheduler.StepLR"
    for r in range(3):
        full, stopped, resumed = (torch.load(tmp_path / f"{mode}{r}.pt") for mode in ("full", "stop", "resume"))
        assert stopped["updates"] == 10 and full["updates"] == resumed["updates"] == 14
        assert resumed["position"] == full["position"] == (3, 0)
        assert any(not torch.equal(a, b) for a, b in zip(stopped["params"], full["params"]))
        for i, (a, b) in enumerate(zip(resumed["params"], full["params"])):
            assert torch.equal(a, b), f"rank {r}, parameter {i}: differs by {(a - b).abs().max().item():.3g}"


def hetseq_eval():
    path = os.environ.get("HETSEQ_EVAL") or os.path.join(os.path.dirname(hetseq.__file__), "..", "..", "bin",
                                                         "hetseq-eval")
    assert os.path.exists(path), f"no hetseq-eval at {path}: build it, or set HETSEQ_EVAL"
    return path


@pytest.mark.parametrize("optimizer", ["torch.optim", "sharded"])
def test_a_checkpoint_from_python_is_evaluated_by_hetseq_eval(tmp_path, mnist_subset, optimizer):
    hidden, checkpoint = 16, tmp_path / "mnist.pt"
    torchrun(2, os.path.join(HERE, "eval_worker.py"), mnist_subset, checkpoint, hidden, 4, optimizer)
    p = subprocess.run([hetseq_eval(), "--task", "mnist", "--data", str(mnist_subset), "--hidden-units", str(hidden),
                        "--path", str(checkpoint), "--max-sentences", "50", "--log-format", "json", "--cpu"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    records = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    valid = [r for r in records if r.get("tag") == "valid"]
    assert len(valid) == 1, p.stdout
    # The same weights in Python, read with torch.load, on the same samples.
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["args"]["task"] == "mnist" and saved["extra_state"]["num_updates"] == 4
    assert saved["optimizer"]["name"] == "torch.optim.Adam"  # a sharded run's too: its state is saved unsharded
    model = MnistNet(hidden)
    model.load_state_dict(saved["model"])
    model.eval()
    stats = pixel_stats(read_idx(os.path.join(mnist_subset, "train-images-idx3-ubyte")))
    x, y = load_split(mnist_subset, "test", stats)
    with torch.no_grad():
        log_probs = torch.cat([model(x[i:i + 50]) for i in range(0, len(y), 50)])
    correct = (log_probs.argmax(1) == y).sum().item()
    loss = F.nll_loss(log_probs, y, reduction="sum").item() / len(y) / np.log(2)
    print(f"hetseq-eval: {valid[0]}; Python: accuracy {100 * correct / len(y)}, loss {loss}")
    assert valid[0]["accuracy"] == pytest.approx(100 * correct / len(y), abs=1e-9)
    assert 15 < valid[0]["accuracy"] < 100  # four updates learn something, and the figure is no constant
    assert valid[0]["loss"] == pytest.approx(loss, rel=1e-5)


def test_a_damaged_checkpoint_is_an_input_error_naming_the_file(tmp_path):
    c = hetseq._C.Checkpoint()
    c.model = [("w", torch.arange(6.0).reshape(2, 3))]
    path = tmp_path / "c.pt"
    hetseq._C.save_checkpoint(c, str(path))
    assert torch.equal(hetseq._C.load_checkpoint(str(path)).model[0][1], torch.arange(6.0).reshape(2, 3))
    data = bytearray(path.read_bytes())
    at = data.find(struct.pack("<6f", *range(6)))  # the tensor's bytes: 1.0 becomes another number
    assert at > 0
    data[at + 7] ^= 0x01
    (tmp_path / "damaged.pt").write_bytes(bytes(data))
    with pytest.raises(hetseq.InputError, match="damaged.pt"):
        hetseq._C.load_checkpoint(str(tmp_path / "damaged.pt"))
    (tmp_path / "short.pt").write_bytes(bytes(data[:len(data) // 2]))
    with pytest.raises(hetseq.InputError, match="short.pt: .*truncated"):
        hetseq._C.load_checkpoint(str(tmp_path / "short.pt"))
