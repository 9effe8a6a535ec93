"""Lightning's "LightningModule in 15 minutes" autoencoder, on synthetic MNIST-sized images.

The tutorial's LitAutoEncoder (encoder/decoder MLPs, MSE reconstruction, Adam) with its
validation_step, trained by ``L.Trainer`` on the CPU: sanity-check validation, a validation
loop every epoch. Data: 28x28 images in [0, 1] made of a few smooth blobs (learnable).
No logger, checkpoint or progress bar is written.
"""
import tempfile

import lightning as L
import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset


def blob_images(count, seed):
    g = torch.Generator().manual_seed(seed)
    grid = torch.stack(torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij"))
    centers = torch.rand(count, 2, 1, 1, generator=g) * 20 + 4
    dist2 = ((grid.unsqueeze(0) - centers) ** 2).sum(1)
    images = torch.exp(-dist2 / 18.0).unsqueeze(1)  # [N, 1, 28, 28] in [0, 1]
    return TensorDataset(images, torch.zeros(count, dtype=torch.long))


# define any number of nn.Modules (or use your current ones)
encoder = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 3))
decoder = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 28 * 28))


# define the LightningModule
class LitAutoEncoder(L.LightningModule):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def training_step(self, batch, batch_idx):
        # training_step defines the train loop; it is independent of forward
        x, _ = batch
        x = x.view(x.size(0), -1)
        z = self.encoder(x)
        x_hat = self.decoder(z)
        loss = nn.functional.mse_loss(x_hat, x)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        x = x.view(x.size(0), -1)
        x_hat = self.decoder(self.encoder(x))
        self.log("val_loss", nn.functional.mse_loss(x_hat, x))

    def configure_optimizers(self):
        return optim.Adam(self.parameters(), lr=1e-3)


L.seed_everything(0, verbose=False)
autoencoder = LitAutoEncoder(encoder, decoder)
train_loader = DataLoader(blob_images(64, 1), batch_size=4, shuffle=True)
val_loader = DataLoader(blob_images(16, 2), batch_size=8)
with tempfile.TemporaryDirectory() as root:
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, default_root_dir=root,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model=autoencoder, train_dataloaders=train_loader, val_dataloaders=val_loader)
    print("val_loss", float(trainer.callback_metrics["val_loss"]))
