"""Lightning manual optimization with two optimizers (the structure of Lightning's GAN example).

``automatic_optimization = False``: the training_step fetches both optimizers, and for
each one calls ``zero_grad``, ``self.manual_backward(loss)`` and ``step`` itself, with
``toggle_optimizer`` so only the active network's parameters get gradients.
"""
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitGAN(L.LightningModule):
    def __init__(self, latent=8):
        super().__init__()
        self.automatic_optimization = False
        self.latent = latent
        self.generator = nn.Sequential(nn.Linear(latent, 32), nn.ReLU(), nn.Linear(32, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.size(0), self.latent)
        ones = torch.ones(real.size(0), 1)
        zeros = torch.zeros(real.size(0), 1)

        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        real_loss = F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
        fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z).detach()), zeros)
        d_loss = (real_loss + fake_loss) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss})

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        return [opt_g, opt_d]


L.seed_everything(0, verbose=False)
g = torch.Generator().manual_seed(1)
angles = torch.rand(64, generator=g) * 6.283
ring = torch.stack([angles.cos(), angles.sin()], dim=1) + 0.05 * torch.randn(64, 2, generator=g)
with tempfile.TemporaryDirectory() as root:
    trainer = L.Trainer(max_epochs=4, accelerator="cpu", devices=1, default_root_dir=root, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LitGAN(), DataLoader(TensorDataset(ring), batch_size=8, shuffle=True))
    print({k: round(float(v), 3) for k, v in trainer.callback_metrics.items()})
