"""An accelerate loop whose per-epoch evaluation forgets ``model.eval()``.

The evaluation runs under ``torch.no_grad()`` through the prepared model, with Dropout
and BatchNorm still in training mode: accuracy is noisy and BatchNorm's running
statistics drift toward the evaluation data.
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
x = torch.randn(96, 16, generator=g)
y = (x[:, :4].sum(1) > 0).long()
train_dataloader = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8, shuffle=True)
eval_dataloader = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=16)
model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
    model, optimizer, train_dataloader, eval_dataloader)
for epoch in range(2):
    model.train()
    for inputs, targets in train_dataloader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
    correct = 0
    for inputs, targets in eval_dataloader:
        with torch.no_grad():
            predictions = model(inputs).argmax(dim=-1)  # expect: M101
        predictions, references = accelerator.gather_for_metrics((predictions, targets))
        correct += (predictions == references).sum().item()
    accelerator.print(f"epoch {epoch}: accuracy {correct / 32:.3f}")
