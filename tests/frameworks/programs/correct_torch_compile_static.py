"""A model compiled with ``torch.compile`` (default inductor backend), fixed input shapes.

The compiled module is what the loop calls; the optimizer holds the original parameters
(shared with the compiled wrapper); evaluation runs the same compiled module in eval mode.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
x = torch.randn(64, 16)
y = (x[:, :4].sum(1) > 0).long()
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))
compiled = torch.compile(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for epoch in range(4):
    compiled.train()
    for i in range(0, 64, 8):
        loss = F.cross_entropy(compiled(x[i:i + 8]), y[i:i + 8])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    compiled.eval()
    with torch.no_grad():
        accuracy = (compiled(x[:8]).argmax(1) == y[:8]).float().mean().item()
    print(f"epoch {epoch}: loss {loss.item():.3f} accuracy {accuracy:.2f}")
