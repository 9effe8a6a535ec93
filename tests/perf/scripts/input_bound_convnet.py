"""Input-bound conv net: loading sleeps per sample (parallelises in workers); the step's costs
are sleeps a change removes or adds, stand-ins for GPU kernel time on a CPU test machine:
NCHW input costs NCHW_S more (the layout transposes channels_last removes), autocast AUTOCAST_S
more (a change that is slower on compute). Loading 8 × SAMPLE_S a batch in the main process
against a step of COMPUTE_S + NCHW_S: the loop waits for data most of the step."""
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

SAMPLE_S = float(sys.argv[1]) if len(sys.argv) > 1 else 0.004
COMPUTE_S = float(sys.argv[2]) if len(sys.argv) > 2 else 0.002
NCHW_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
AUTOCAST_S = float(sys.argv[4]) if len(sys.argv) > 4 else 0.01


class Images(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, index):
        time.sleep(SAMPLE_S)
        return torch.full((3, 8, 8), float(index % 5) / 5), index % 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten(), nn.Linear(4, 4))

    def forward(self, x):
        time.sleep(COMPUTE_S)
        if not x.is_contiguous(memory_format=torch.channels_last):
            time.sleep(NCHW_S)
        if torch.is_autocast_enabled("cpu"):
            time.sleep(AUTOCAST_S)
        return self.body(x)


torch.manual_seed(0)
torch.set_num_threads(1)  # steady timings on a shared CI machine
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = nn.CrossEntropyLoss()
loader = DataLoader(Images(), batch_size=8, shuffle=True)
for _epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
