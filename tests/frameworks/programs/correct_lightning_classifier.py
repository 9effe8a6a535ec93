"""A Lightning image classifier with BatchNorm and Dropout, a validation loop and an epoch scheduler.

``L.Trainer`` switches the module to eval mode for the sanity check and every validation
loop, and back to train mode after; ``configure_optimizers`` returns SGD with a StepLR
stepped per epoch (Lightning's default interval). Inputs are normalized synthetic images
whose class is the quadrant holding a bright square.
"""
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def quadrant_images(count, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (count,), generator=g)
    images = torch.rand(count, 3, 16, 16, generator=g) * 0.2
    for i, label in enumerate(labels.tolist()):
        row, col = divmod(label, 2)
        images[i, :, row * 8 + 2: row * 8 + 6, col * 8 + 2: col * 8 + 6] += 0.8
    return TensorDataset((images - 0.2) / 0.3, labels)


class LitClassifier(L.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 4))

    def forward(self, x):
        return self.head(self.features(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return [optimizer], [scheduler]


L.seed_everything(0, verbose=False)
train_loader = DataLoader(quadrant_images(64, 1), batch_size=8, shuffle=True)
val_loader = DataLoader(quadrant_images(32, 2), batch_size=16)
with tempfile.TemporaryDirectory() as root:
    trainer = L.Trainer(max_epochs=4, accelerator="cpu", devices=1, default_root_dir=root,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(LitClassifier(), train_loader, val_loader)
    print({k: round(float(v), 3) for k, v in trainer.callback_metrics.items()})
