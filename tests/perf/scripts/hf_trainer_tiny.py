"""A tiny BERT classifier (built from a config: no download) trained by Hugging Face's Trainer."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments  # noqa: E402

torch.manual_seed(0)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        ids = torch.randint(5, 100, (16,), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones(16, dtype=torch.long), "labels": int(ids[0] % 2)}


config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=16, max_steps=10_000,
                         learning_rate=1e-3, report_to=[], logging_steps=1000, save_strategy="no",
                         use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
