"""A loss read back with .item() on every step (a host-device sync on CUDA)."""
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
torch.set_num_threads(1)  # steady timings on a shared CI machine
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 32, device=device)
y = torch.randint(0, 4, (64,), device=device)
total = 0.0
for _step in range(40):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    total += loss.item()  # the sync
print(total)
