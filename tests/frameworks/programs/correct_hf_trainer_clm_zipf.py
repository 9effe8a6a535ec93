"""Hugging Face Trainer, run_clm-style: a token stream concatenated and cut into blocks
(``group_texts``), labels equal to the input ids (the model shifts them), a tiny GPT-2 built from
a config. The tokens follow Zipf's law, as words do: the next-token targets are skewed by
nature, which is not a class imbalance. Offline: nothing is downloaded."""
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
torch.manual_seed(0)
VOCAB, BLOCK = 128, 32


def group_texts(token_stream, block_size):
    total = (len(token_stream) // block_size) * block_size
    blocks = [token_stream[i:i + block_size] for i in range(0, total, block_size)]
    return [{"input_ids": b, "attention_mask": [1] * block_size, "labels": list(b)} for b in blocks]


zipf = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float)
sentences = torch.multinomial(zipf / zipf.sum(), 32 * 8, replacement=True).view(32, 8)  # words by Zipf's law
stream = sentences[torch.randint(0, 32, (48 * BLOCK // 8,))].reshape(-1).tolist()      # a corpus of them
train_dataset = group_texts(stream, BLOCK)

config = GPT2Config(vocab_size=VOCAB, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)

with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=4, learning_rate=1e-3, num_train_epochs=2,
        warmup_steps=4, save_strategy="no", logging_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True, seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_dataset, data_collator=default_data_collator)
    trainer.train()
