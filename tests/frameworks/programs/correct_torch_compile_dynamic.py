"""``torch.compile(dynamic=True)`` on variable-length batches (sequence length changes per batch).

A small embedding + GRU-free mean-pooling classifier compiled once with dynamic shapes, fed
batches whose sequence length varies, trained with AdamW and evaluated in eval mode.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class MeanPoolClassifier(nn.Module):
    def __init__(self, vocab=32, hidden=32, classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden))
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens):
        return self.head(self.mlp(self.embed(tokens)).mean(dim=1))


model = MeanPoolClassifier()
compiled = torch.compile(model, dynamic=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
g = torch.Generator().manual_seed(1)
for step in range(32):
    length = 9 + step % 8  # 9..16 tokens: never the batch size, whose equality (duck sizing) would cost a recompile
    tokens = torch.randint(0, 32, (8, length), generator=g)
    labels = (tokens < 16).float().mean(1).gt(0.5).long()
    loss = F.cross_entropy(compiled(tokens), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
compiled.eval()
with torch.no_grad():
    print("final loss", loss.item(), compiled(torch.randint(0, 32, (4, 12))).shape)
