"""hetseq.train: the MNIST task of hetseq-train trained in the pytest process from Python, a few updates on real
IDX files; its result, its checkpoint and Python's own evaluation of that checkpoint agree; Python's SIGINT
handler is back afterwards; a misspelt flag is a hetseq.UsageError."""
import os
import signal

import pytest
import torch
import torch.nn.functional as F

import hetseq
from mnist_net import MnistNet, load_split, pixel_stats, read_idx


def test_hetseq_train_runs_the_mnist_task(tmp_path, mnist_subset):
    before = signal.getsignal(signal.SIGINT)
    result = hetseq.train({"task": "mnist", "max-update": 3, "max-sentences": 40, "save-dir": tmp_path, "cpu": True,
                           "no-progress-bar": True, "optimizer": "adam", "lr": 0.002, "seed": 3},
                          {"data": mnist_subset, "hidden-units": 16})
    assert result["num_updates"] == 3 and not result["stopped"]
    assert signal.getsignal(signal.SIGINT) is before  # Note [hetseq.train and Python's signals]
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
    saved = hetseq._C.load_checkpoint(str(tmp_path / "checkpoint_last.pt"))
    assert saved.task == "mnist" and saved.num_updates == 3 and saved.optimizer_name == "adam"
    # The saved weights, evaluated in Python on the task's test split, give the result's validation figures.
    model = MnistNet(16)
    model.load_state_dict(dict(saved.model))
    model.eval()
    x, y = load_split(mnist_subset, "test", pixel_stats(read_idx(os.path.join(mnist_subset, "train-images-idx3-ubyte"))))
    with torch.no_grad():
        log_probs = model(x)
    accuracy = 100 * (log_probs.argmax(1) == y).sum().item() / len(y)
    loss = F.nll_loss(log_probs, y, reduction="sum").item() / len(y) / torch.log(torch.tensor(2.0)).item()
    print(f"hetseq.train: {result}; Python: accuracy {accuracy}, loss {loss}")
    assert result["valid"]["accuracy"] == pytest.approx(accuracy, abs=1e-9)
    assert result["valid"]["loss"] == pytest.approx(loss, rel=1e-4)


def test_a_misspelt_flag_is_a_usage_error(mnist_subset):
    with pytest.raises(hetseq.UsageError, match="max-updat"):
        hetseq.train({"task": "mnist", "max-updat": 3}, {"data": mnist_subset})
