"""What several of the Python extension's tests share."""
import gzip
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mnist_net import write_idx  # noqa: E402

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="session")
def mnist_subset(tmp_path_factory):
    """The first 320 train and 200 test samples of Fashion-MNIST as IDX files: the MNIST task's data, small."""
    out = tmp_path_factory.mktemp("fashion-mnist")
    for prefix, n in (("train", 320), ("t10k", 200)):
        for kind in ("images-idx3", "labels-idx1"):
            with gzip.open(os.path.join(FASHION_MNIST, f"{prefix}-{kind}-ubyte.gz")) as f:
                data = f.read()
            dims = data[3]
            shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
            write_idx(out / f"{prefix}-{kind}-ubyte", np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)[:n])
    return out
