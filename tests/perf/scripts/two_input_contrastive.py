"""Two inputs, a tuple output and a hand-written contrastive (InfoNCE) loss."""

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.left = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16))
        self.right = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, a, b):
        return F.normalize(self.left(a), dim=-1), F.normalize(self.right(b), dim=-1)


def info_nce(pair, temperature=0.1):
    left, right = pair
    logits = left @ right.T / temperature
    return F.cross_entropy(logits, torch.arange(len(left)))


model = TwoTower()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for _step in range(10_000):
    a, b = torch.randn(32, 20), torch.randn(32, 12)
    loss = info_nce(model(a, b))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
