"""A small DDP training loop on gloo (CPU) for `torchrun -m nndoctor perf` tests: ACCUMULATE
micro-batches per optimizer step (argv[1], default 2) without no_sync(), and small buckets
(bucket_cap_mb=0.25) so the all-reduce runs in several buckets during the backward."""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

ACCUMULATE = int(sys.argv[1]) if len(sys.argv) > 1 else 2

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(
    nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)),
    bucket_cap_mb=0.25)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
loader = DataLoader(data, batch_size=32)
for _epoch in range(100):
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y) / ACCUMULATE
        loss.backward()
        if (i + 1) % ACCUMULATE == 0:
            optimizer.step()
            optimizer.zero_grad()
dist.destroy_process_group()
