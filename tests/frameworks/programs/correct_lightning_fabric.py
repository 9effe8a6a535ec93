"""Lightning Fabric: a plain loop with ``fabric.setup``, ``fabric.backward`` and gradient clipping.

The scheduler is built on the optimizer before ``fabric.setup`` wraps it, and steps after
every optimizer step; evaluation each epoch in eval mode under ``no_grad``.
"""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

fabric = L.Fabric(accelerator="cpu", devices=1)
fabric.seed_everything(0)
x = torch.randn(64, 16)
y = (x[:, :4].sum(1) > 0).long()
model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=32)
model, optimizer = fabric.setup(model, optimizer)
loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True))
for epoch in range(4):
    model.train()
    for a, b in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(a), b)
        fabric.backward(loss)
        fabric.clip_gradients(model, optimizer, max_norm=1.0)
        optimizer.step()
        scheduler.step()
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean()
    fabric.print(epoch, loss.item(), acc.item())
