"""A LightningModule whose batch "augmentation" shuffles inputs and labels with different permutations.

Each sample ends up paired with another sample's label, so there is nothing to learn: the
training loss stays at chance however long it trains. Lightning calls backward itself, so
the finding is reported at the user's ``trainer.fit()`` call.
"""
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x[torch.randperm(len(x))]  # shuffle within the batch...
        y = y[torch.randperm(len(y))]  # ...but the labels with another permutation
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


L.seed_everything(0, verbose=False)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g)
y = x[:, :4].argmax(1)
with tempfile.TemporaryDirectory() as root:
    trainer = L.Trainer(max_epochs=5, accelerator="cpu", devices=1, default_root_dir=root, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LitClassifier(), DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True))  # expect: L106
