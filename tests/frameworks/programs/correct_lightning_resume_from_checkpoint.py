"""Lightning checkpointing: fit with ModelCheckpoint, resume from ``last.ckpt``, load the best.

A first ``Trainer`` trains two epochs and writes checkpoints (best by validation loss, and
``last.ckpt``) into a temporary directory; a second ``Trainer`` resumes the run from
``last.ckpt`` for one more epoch (model, optimizer and loop state restored); finally
``load_from_checkpoint`` rebuilds the best model for evaluation.
"""
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitMLP(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


L.seed_everything(0, verbose=False)
g = torch.Generator().manual_seed(1)
x = torch.randn(80, 16, generator=g)
y = x[:, :4].argmax(1)
train_loader = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8, shuffle=True)
val_loader = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=8)
with tempfile.TemporaryDirectory() as root:
    options = dict(accelerator="cpu", devices=1, default_root_dir=root, logger=False,
                   enable_progress_bar=False, enable_model_summary=False)
    checkpoint = ModelCheckpoint(dirpath=root, monitor="val_loss", save_last=True)
    L.Trainer(max_epochs=2, callbacks=[checkpoint], **options).fit(LitMLP(), train_loader, val_loader)
    resumed = L.Trainer(max_epochs=3, **options)
    resumed.fit(LitMLP(), train_loader, val_loader, ckpt_path=checkpoint.last_model_path)
    best = LitMLP.load_from_checkpoint(checkpoint.best_model_path).eval()
    with torch.no_grad():
        print("best val accuracy", (best(x[64:]).argmax(1) == y[64:]).float().mean().item())
