"""Full-batch L-BFGS with a closure (the torch.optim.LBFGS documentation pattern).

``optimizer.step(closure)`` evaluates the closure several times per step: each call zeroes
the gradients, computes the loss and runs backward; the strong-Wolfe line search decides
how many. A small regression MLP fitted to a smooth function.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
x = torch.linspace(-2, 2, 64).unsqueeze(1)
y = torch.sin(2 * x) + 0.1 * x ** 2
model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=10, history_size=10,
                              line_search_fn="strong_wolfe")


def closure():
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss


for step in range(8):
    loss = optimizer.step(closure)
    print(f"step {step}: loss {loss.item():.5f}")
