"""A compute-bound loop (no DataLoader: one batch made up front) whose Adam runs its default
per-parameter loop over 242 small tensors on the CPU: the optimizer is about half of the step,
so fused kernels (``--try fused-optimizer``) pay clearly."""
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)  # steady timings on a shared CI machine
model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16)) for _ in range(60)], nn.Linear(16, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
x = torch.randn(8, 16)
y = torch.randint(0, 4, (8,))
for _step in range(40):
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
