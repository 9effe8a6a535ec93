"""Hugging Face Trainer on a tiny BERT whose labels were permuted separately from the inputs.

128 random 16-token sequences are labelled by their first token (learnable), then the labels
get a permutation of their own: nothing is left to learn. Trainer runs 5 epochs of 16 steps;
a model this size starts memorising the random labels within those epochs, so the loss drifts
below the label prior's entropy on batches it has seen before, while on the batches of the
first epoch, which it has not seen yet, it stays at chance.
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

SEQ, VOCAB, SAMPLES = 16, 64, 128


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, input_ids, labels):
        self.input_ids, self.labels = input_ids, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[i]}


g = torch.Generator().manual_seed(1)
input_ids = torch.randint(1, VOCAB, (SAMPLES, SEQ), generator=g)
labels = (input_ids[:, 0] >= VOCAB // 2).long()
labels = labels[torch.randperm(SAMPLES, generator=g)]  # the bug: the labels get a permutation of their own

config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ, num_labels=2)
model = BertForSequenceClassification(config)

with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=8, learning_rate=1e-3, num_train_epochs=5,
        save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=True, seed=0, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(input_ids, labels))
    trainer.train()  # expect: L108
