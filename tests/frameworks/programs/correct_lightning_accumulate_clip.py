"""Lightning with gradient accumulation, gradient clipping, a per-step OneCycle schedule and test/predict.

``accumulate_grad_batches=2`` (Lightning divides the loss and steps every second batch),
``gradient_clip_val=1.0``, ``configure_optimizers`` returning AdamW with a OneCycleLR whose
``interval`` is ``"step"``, validation every epoch, then ``trainer.test`` and
``trainer.predict`` (inference mode) on the trained module.
"""
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def dataset(count, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 16, generator=g)
    return TensorDataset(x, x[:, :4].argmax(1))


class LitMLP(L.LightningModule):
    def __init__(self, steps):
        super().__init__()
        self.steps = steps
        self.net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(1) == y).float().mean())

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).softmax(dim=1)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=self.steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


L.seed_everything(0, verbose=False)
train_loader = DataLoader(dataset(64, 1), batch_size=4, shuffle=True)
val_loader = DataLoader(dataset(32, 2), batch_size=16)
epochs, accumulate = 4, 2
with tempfile.TemporaryDirectory() as root:
    trainer = L.Trainer(max_epochs=epochs, accumulate_grad_batches=accumulate, gradient_clip_val=1.0,
                        accelerator="cpu", devices=1, default_root_dir=root, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = LitMLP(steps=epochs * len(train_loader) // accumulate)
    trainer.fit(model, train_loader, val_loader)
    (tested,) = trainer.test(model, val_loader, verbose=False)
    probabilities = trainer.predict(model, val_loader)
    print("test", tested["test_acc"], probabilities[0].shape)
