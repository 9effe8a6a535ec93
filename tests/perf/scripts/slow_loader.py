"""Data-bound loop: 8 samples x 3 ms of loading against ~6 ms of 'compute' per step."""
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

SAMPLE_S = float(sys.argv[1]) if len(sys.argv) > 1 else 0.003
COMPUTE_S = float(sys.argv[2]) if len(sys.argv) > 2 else 0.006


class SlowDataset(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, index):
        time.sleep(SAMPLE_S)
        return torch.full((8,), float(index % 5)), index % 2


torch.manual_seed(0)
torch.set_num_threads(1)  # steady timings on a shared CI machine
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(SlowDataset(), batch_size=8, shuffle=True)
for _epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        time.sleep(COMPUTE_S)  # stands for GPU work the host waits on
        optimizer.step()
