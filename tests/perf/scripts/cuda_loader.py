"""Data-bound loop on the GPU: 8 samples x 3 ms of loading per batch, a small model on CUDA."""
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, index):
        time.sleep(0.003)
        return torch.full((3, 16, 16), float(index % 5)), index % 2


torch.manual_seed(0)
device = "cuda"
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 2)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(SlowDataset(), batch_size=8, shuffle=True)
for _epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
