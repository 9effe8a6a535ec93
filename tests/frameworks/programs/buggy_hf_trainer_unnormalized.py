"""Hugging Face Trainer on a custom image model fed raw 0-255 pixels (no normalization).

Trainer accepts any nn.Module whose forward returns the loss; the dataset hands it float
pixels straight from uint8 images. The model is called inside Trainer, so the finding is
reported at the user's ``trainer.train()`` call.
"""
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
torch.manual_seed(0)


class ImageDataset(torch.utils.data.Dataset):
    def __init__(self, count, seed):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (count, 3, 16, 16), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 4, (count,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"pixel_values": self.images[i].float(), "labels": self.labels[i]}  # 0-255 floats


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.classifier = nn.Linear(8 * 16, 4)

    def forward(self, pixel_values, labels=None):
        logits = self.classifier(self.features(pixel_values).flatten(1))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, num_train_epochs=1,
                             learning_rate=1e-3, save_strategy="no", logging_strategy="no",
                             report_to="none", disable_tqdm=True, use_cpu=True, seed=0)
    trainer = Trainer(model=SmallConvNet(), args=args, train_dataset=ImageDataset(64, 1))
    trainer.train()  # expect: D101
