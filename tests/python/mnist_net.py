"""The MNIST task's model (tasks/mnist/mnist_model.h, HetSeq's MNISTNet) in Python, with its parameter names and
shapes, so that hetseq-eval --task mnist evaluates a checkpoint written from Python; and the task's IDX files and
normalisation (tasks/mnist/mnist_dataset.cpp), for the tests."""
import os

import numpy as np
import torch
import torch.nn.functional as F


class MnistNet(torch.nn.Module):
    def __init__(self, hidden=128, dropout=(0.25, 0.5)):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(1, 32, 3), torch.nn.Conv2d(32, 64, 3)
        self.dropout1, self.dropout2 = torch.nn.Dropout2d(dropout[0]), torch.nn.Dropout(dropout[1])
        self.fc1, self.fc2 = torch.nn.Linear(9216, hidden), torch.nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def write_idx(path, array):
    """An IDX file (big-endian dims, uint8 data) as the MNIST task reads it."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, array.ndim]))
        for n in array.shape:
            f.write(int(n).to_bytes(4, "big"))
        f.write(array.tobytes())


def read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.from_numpy(np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape).copy())


def pixel_stats(images):
    """The task's mean and standard deviation of the train pixels, from their exact histogram."""
    counts = torch.bincount(images.flatten().long(), minlength=256).tolist()
    n = images.numel()
    total = sum(c * (v / 255.0) for v, c in enumerate(counts))
    squares = sum(c * (v / 255.0) * (v / 255.0) for v, c in enumerate(counts))
    mean = total / n
    return mean, max(0.0, squares / n - mean * mean) ** 0.5


def load_split(data, split, stats):
    prefix = {"train": "train", "test": "t10k"}[split]
    images = read_idx(os.path.join(data, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(os.path.join(data, f"{prefix}-labels-idx1-ubyte")).long()
    x = images.float().div_(255.0).sub_(stats[0]).div_(stats[1])
    return x.unsqueeze(1), labels
