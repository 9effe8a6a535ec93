"""Hugging Face Trainer fine-tuning a tiny ViT (run_image_classification-style) whose pixels are
rescaled twice: torchvision's ToTensor() already maps them to 0–1, then ViTImageProcessor
(do_rescale=True by default) divides by 255 again and normalises with mean = std = 0.5.
Every value ends in [-1, -0.992]. Trainer calls model(labels=..., pixel_values=...): keyword
inputs only, labels first (default_data_collator puts "label" first as "labels").
Offline: the model is built from a ViTConfig, nothing is downloaded.
"""
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import ToTensor
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification, ViTImageProcessor
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
torch.manual_seed(0)
processor = ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
to_tensor = ToTensor()


class ImageDataset(torch.utils.data.Dataset):
    def __init__(self, count, seed):
        rng = np.random.default_rng(seed)
        self.images = [Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)) for _ in range(count)]
        self.labels = rng.integers(0, 4, count).tolist()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        pixels = processor(images=to_tensor(self.images[i]), return_tensors="pt")["pixel_values"][0]
        return {"label": self.labels[i], "pixel_values": pixels}


config = ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, num_labels=4)
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, num_train_epochs=1,
                             learning_rate=1e-3, save_strategy="no", logging_strategy="no",
                             report_to="none", disable_tqdm=True, use_cpu=True, seed=0)
    trainer = Trainer(model=ViTForImageClassification(config), args=args, train_dataset=ImageDataset(64, 1))
    trainer.train()  # expect: D102
