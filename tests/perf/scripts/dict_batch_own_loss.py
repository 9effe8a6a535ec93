"""A Hugging Face-style model: called with a dict batch (**batch), computes its own loss and
returns it in an output object."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)


@dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(50, 24, mode="sum")
        self.head = nn.Linear(24, 3)

    def forward(self, input_ids, attention_mask, labels=None):
        logits = self.head(self.embed(input_ids, per_sample_weights=attention_mask.float()))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return Output(loss=loss, logits=logits)


model = Classifier()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for _step in range(10_000):
    batch = {"input_ids": torch.randint(0, 50, (16, 12)), "attention_mask": torch.ones(16, 12, dtype=torch.long),
             "labels": torch.randint(0, 3, (16,))}
    outputs = model(**batch)
    outputs.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
