"""A sweep trains two same-sized models one after the other; the second one is evaluated in training mode.

Only the second configuration's evaluation forgets ``model.eval()`` (its Dropout stays
active under ``no_grad``), after the first optimizer already made its steps.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g)
y = (x[:, :4].sum(1) > 0).long()
for dropout, lr in ((0.1, 3e-3), (0.3, 1e-2)):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for epoch in range(2):
        for i in range(0, 64, 8):
            loss = F.cross_entropy(model(x[i:i + 8]), y[i:i + 8])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    if dropout == 0.1:
        model.eval()
        with torch.no_grad():
            accuracy = (model(x).argmax(1) == y).float().mean().item()
    else:
        with torch.no_grad():  # model.eval() forgotten for this configuration
            accuracy = (model(x).argmax(1) == y).float().mean().item()  # expect: M101
    print(dropout, lr, accuracy)
