"""A small sweep: a fresh model and optimizer per (width, lr), trained one after the other.

The pattern of notebooks and tuning scripts: the second model starts training after the
first one's optimizer has already made its steps, so each optimizer has its own step count;
the last model is still alive when the run ends (the script's helper function keeps its
globals).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g)
y = (x[:, :4].sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)


def accuracy(model):
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


results = {}
for width, lr in ((32, 3e-3), (64, 1e-2)):
    model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for epoch in range(2):
        model.train()
        for inputs, targets in loader:
            loss = F.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    results[lr] = accuracy(model)
print(results)
