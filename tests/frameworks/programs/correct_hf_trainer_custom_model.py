"""Hugging Face Trainer on a plain nn.Module image classifier with BatchNorm and Dropout.

Trainer accepts any module whose forward takes the batch's keys and returns the loss; it
clips gradients, evaluates every epoch (switching the model to eval mode) and ``predict``
runs at the end.
Pixels are scaled to [0, 1] and standardized.
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


class QuadrantImages(torch.utils.data.Dataset):
    """The class is the quadrant holding a bright square; pixels standardized."""

    def __init__(self, count, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (count,), generator=g)
        images = torch.rand(count, 3, 16, 16, generator=g) * 0.2
        for i, label in enumerate(self.labels.tolist()):
            row, col = divmod(label, 2)
            images[i, :, row * 8 + 2: row * 8 + 6, col * 8 + 2: col * 8 + 6] += 0.8
        self.images = (images - 0.2) / 0.3

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"pixel_values": self.images[i], "labels": self.labels[i]}


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 4))

    def forward(self, pixel_values, labels=None):
        logits = self.classifier(self.features(pixel_values))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=8, per_device_eval_batch_size=16,
        num_train_epochs=4, learning_rate=3e-3, max_grad_norm=1.0,
        eval_strategy="epoch", save_strategy="no", logging_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True, seed=0,
    )
    trainer = Trainer(model=SmallConvNet(), args=args, train_dataset=QuadrantImages(64, 1),
                      eval_dataset=QuadrantImages(32, 2))
    trainer.train()
    predictions = trainer.predict(QuadrantImages(16, 3))
    print("predict accuracy", float((predictions.predictions.argmax(-1) == predictions.label_ids).mean()))
