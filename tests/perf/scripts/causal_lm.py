"""A decoder-only language model: tokens made on the device, logits reshaped and cast before
the loss (the step shape a rebuilt ``loss(model(x), y)`` cannot reproduce)."""

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
VOCAB, CONTEXT, WIDTH = 97, 16, 32


class TinyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.block = nn.TransformerEncoderLayer(WIDTH, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        h = self.block(self.embed(tokens) + self.position, src_mask=mask, is_causal=True)
        return self.head(h)


model = TinyDecoder()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(10_000):
    tokens = torch.randint(0, VOCAB, (8, CONTEXT + 1))
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.3f}")
