"""Greedy layer-wise training: each block is trained by its own optimizer, one after the other.

Block 1 is trained with its own Adam and a temporary head; then it is frozen and block 2
is trained on top of it with a fresh optimizer and head; finally every layer is fine-tuned
together with a third optimizer. Several optimizers in sequence, each one's parameters
frozen or left alone while the next trains.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g)
y = (x[:, :4].sum(1) > 0).long()
blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 32), nn.ReLU()),
                        nn.Sequential(nn.Linear(32, 32), nn.ReLU())])
head = nn.Linear(32, 2)


def train(parameters, forward, steps, lr):
    optimizer = torch.optim.Adam(parameters, lr=lr)
    for step in range(steps):
        i = (step * 8) % 64
        loss = F.cross_entropy(forward(x[i:i + 8]), y[i:i + 8])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


# Stage 1: the first block with a temporary head.
probe1 = nn.Linear(32, 2)
print("stage 1", train(list(blocks[0].parameters()) + list(probe1.parameters()),
                        lambda v: probe1(blocks[0](v)), 16, 1e-2))
# Stage 2: freeze block 1, train block 2 with the final head.
blocks[0].requires_grad_(False)
print("stage 2", train(list(blocks[1].parameters()) + list(head.parameters()),
                        lambda v: head(blocks[1](blocks[0](v))), 16, 1e-2))
# Stage 3: fine-tune everything together at a lower learning rate.
blocks.requires_grad_(True)
print("stage 3", train(list(blocks.parameters()) + list(head.parameters()),
                        lambda v: head(blocks[1](blocks[0](v))), 16, 1e-3))
