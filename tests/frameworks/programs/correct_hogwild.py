"""Hogwild training with ``torch.multiprocessing.spawn`` (the PyTorch mnist_hogwild example).

The model's parameters live in shared memory (``share_memory()``); two spawned processes
each build their own SGD optimizer over the shared parameters and train on their own
shard of synthetic data, lock-free; the parent then evaluates the shared model.
"""
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def data(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 16, generator=g)
    return x, (x[:, :4].sum(1) > 0).long()


def train(rank, model):
    torch.manual_seed(1 + rank)
    x, y = data(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    model.train()
    for epoch in range(2):
        for i in range(0, 64, 8):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[i:i + 8]), y[i:i + 8])
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Net()
    model.share_memory()
    mp.spawn(train, args=(model,), nprocs=2, join=True)
    model.eval()
    x, y = data(99)
    with torch.no_grad():
        print("accuracy", (model(x).argmax(1) == y).float().mean().item())
