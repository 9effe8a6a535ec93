"""Hugging Face Trainer training a tiny GPT-2 language model built from a config (run_clm-style).

Causal LM on synthetic sequences with a learnable rule (each token is the previous one plus
one, modulo the vocabulary), gradient accumulation, a cosine schedule with weight decay, and an
evaluation pass every epoch. Offline: built from GPT2Config, nothing is downloaded.
"""
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
torch.manual_seed(0)

SEQ, VOCAB = 16, 48


def counting_sequences(count, seed):
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, VOCAB, (count, 1), generator=g)
    ids = (starts + torch.arange(SEQ)) % VOCAB
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)

with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=16,
        gradient_accumulation_steps=2, learning_rate=3e-3, weight_decay=0.01, num_train_epochs=4,
        lr_scheduler_type="cosine", eval_strategy="epoch", save_strategy="no",
        logging_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=counting_sequences(64, 1),
                      eval_dataset=counting_sequences(16, 2))
    trainer.train()
    print(trainer.evaluate())
