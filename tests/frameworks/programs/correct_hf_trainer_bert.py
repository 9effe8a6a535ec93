"""Hugging Face Trainer fine-tuning a tiny BERT built from a config (run_glue-style).

Sequence classification on synthetic token data whose label depends on the tokens, with
gradient accumulation, a linear LR schedule, label smoothing (Trainer then computes the
loss from the logits itself), dropout, and an evaluation pass every epoch.
Offline: the model is built from a BertConfig, nothing is downloaded.
"""
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
torch.manual_seed(0)

SEQ, VOCAB, SAMPLES = 16, 64, 64


class TokenDataset(torch.utils.data.Dataset):
    """Label 1 when the sequence starts with a 'high' token (>= VOCAB/2)."""

    def __init__(self, count, seed):
        g = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(1, VOCAB, (count, SEQ), generator=g)
        self.labels = (self.input_ids[:, 0] >= VOCAB // 2).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[i]}


config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ, num_labels=2)
model = BertForSequenceClassification(config)


def compute_metrics(prediction):
    logits, labels = prediction
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=16,
        gradient_accumulation_steps=2, learning_rate=1e-3, num_train_epochs=4,
        lr_scheduler_type="linear", warmup_steps=2, label_smoothing_factor=0.1,
        eval_strategy="epoch", save_strategy="no", logging_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True, seed=0, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(SAMPLES, 1),
                      eval_dataset=TokenDataset(32, 2), compute_metrics=compute_metrics)
    trainer.train()
    print(trainer.evaluate())
