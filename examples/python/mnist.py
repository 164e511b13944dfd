"""Fashion-MNIST on ranks with unequal batches, from a Python loop with hetseq's exact data parallelism:
    torchrun --nproc-per-node 2 examples/python/mnist.py --batch-sizes 24,40"""
import argparse
import gzip
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import hetseq


def read_idx(path):
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.from_numpy(np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape).copy())


def load(data, split):
    images = read_idx(os.path.join(data, f"{split}-images-idx3-ubyte.gz")).float().div_(255).sub_(0.2860).div_(0.3530)
    return images.unsqueeze(1), read_idx(os.path.join(data, f"{split}-labels-idx1-ubyte.gz")).long()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(1, 16, 5), torch.nn.Conv2d(16, 32, 5)
        self.fc1, self.fc2 = torch.nn.Linear(32 * 4 * 4, 128), torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


parser = argparse.ArgumentParser()
parser.add_argument("--batch-sizes", default="24,40", help="samples per update of each rank")
parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
torch.manual_seed(1)
train_x, train_y = load(args.data, "train")
model = Net()
ddp = hetseq.DistributedDataParallel(model)  # shared memory between the ranks of one machine
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
plan = hetseq.data.Plan(len(train_y), [int(b) for b in args.batch_sizes.split(",")], seed=1)
for epoch in range(1, args.epochs + 1):
    for update in plan.updates(rank, epoch):  # every sample once per epoch, across the ranks
        optimizer.zero_grad()
        with ddp.update(plan.micro_batches, samples=sum(map(len, update))) as u:
            for idx in update:
                if not idx:
                    u.skip()
                    continue
                loss_sum = F.cross_entropy(model(train_x[idx]), train_y[idx], reduction="sum")
                u.backward(loss_sum, sample_size=len(idx))
        optimizer.step()  # the gradients are the sum over the ranks / the update's samples
if rank == 0:
    test_x, test_y = load(args.data, "t10k")
    with torch.no_grad():
        correct = sum((model(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum().item()
                      for i in range(0, len(test_y), 1000))
    print(f"test accuracy: {100 * correct / len(test_y):.2f}%")
dist.destroy_process_group()
