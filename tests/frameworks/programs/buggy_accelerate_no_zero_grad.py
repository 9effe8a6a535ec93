"""An accelerate training loop (nlp_example structure) that never zeroes the gradients.

Every ``optimizer.step()`` applies the running sum of all gradients so far.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

set_seed(0)
accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g)
y = (x[:, :4].sum(1) > 0).long()
train_dataloader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
for epoch in range(2):
    model.train()
    for inputs, targets in train_dataloader:
        loss = F.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)  # expect: O101
        optimizer.step()
