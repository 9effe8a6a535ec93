"""A tiny GPT with attention written out by hand (softmax(Q Kᵀ/√d + causal mask) V), fed by a
DataLoader: what --try sdpa and --try batch-size act on. Argument: the device (default cpu)."""

import math
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
VOCAB, CONTEXT, WIDTH, HEADS = 61, 16, 32, 4


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT)).view(1, 1, CONTEXT, CONTEXT))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.attn = CausalSelfAttention()
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        x = x + self.attn(x)
        return self.head(self.norm(x))


tokens = torch.randint(0, VOCAB, (4096, CONTEXT + 1))
loader = DataLoader(TensorDataset(tokens), batch_size=8, shuffle=True, drop_last=True)
model = TinyGPT().to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _epoch in range(100):
    for (batch,) in loader:
        batch = batch.to(DEVICE)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
