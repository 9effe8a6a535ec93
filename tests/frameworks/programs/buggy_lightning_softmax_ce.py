"""A LightningModule whose training_step applies softmax before cross-entropy (double softmax)."""
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

    def forward(self, x):
        return F.softmax(self.net(x), dim=1)  # probabilities, handy for prediction

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)  # expect: L101
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


L.seed_everything(0, verbose=False)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 16, generator=g)
y = x[:, :4].argmax(1)
with tempfile.TemporaryDirectory() as root:
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, default_root_dir=root, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LitClassifier(), DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True))
