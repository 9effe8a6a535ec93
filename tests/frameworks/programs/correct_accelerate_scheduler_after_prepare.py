"""accelerate with the scheduler built after ``prepare()`` and ``accelerator.accumulate()``.

The scheduler wraps the prepared (Accelerated) optimizer and is not itself prepared, so it
steps only when gradients sync; gradient accumulation is left to accelerate
(``Accelerator(gradient_accumulation_steps=2)``), whose optimizer steps and zeroes only at the
end of each accumulation window; ``clip_grad_norm_`` runs when gradients sync.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

set_seed(0)
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g)
y = (x[:, :4].sum(1) > 0).long()
train_loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
scheduler = torch.optim.lr_scheduler.OneCycleLR(
    optimizer, max_lr=3e-3, total_steps=4 * len(train_loader) // 2)
model.train()
for epoch in range(4):
    for inputs, targets in train_loader:
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(inputs), targets)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if accelerator.sync_gradients:  # one schedule step per real optimizer step
                scheduler.step()
            optimizer.zero_grad()
    accelerator.print(f"epoch {epoch}: loss {loss.item():.3f}")
