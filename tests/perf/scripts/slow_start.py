"""A tiny MLP whose start is slow (it sleeps first, like a model that takes long to build):
every --try re-run pays the sleep, which is what the --budget tests need.

Arguments: SECONDS [COUNTER_FILE] — with a counter file, the first start (nndoctor perf's own
run) does not sleep and every later one (the re-runs) does."""

import os
import sys
import time

import torch
from torch import nn

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
if len(sys.argv) > 2:
    counter = sys.argv[2]
    starts = int(open(counter).read()) if os.path.exists(counter) else 0
    with open(counter, "w") as handle:
        handle.write(str(starts + 1))
    seconds = seconds if starts else 0.0
time.sleep(seconds)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
for _step in range(10_000):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
