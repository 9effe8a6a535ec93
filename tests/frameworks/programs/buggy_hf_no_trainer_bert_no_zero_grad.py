"""run_glue_no_trainer-style loop on a tiny BERT with optimizer.zero_grad() deleted.

BERT's word embeddings reserve row 0 for the padding token (``padding_idx=0``): its gradient is
always zero, and it is the first parameter of the model. Every other gradient accumulates step
after step. Offline: the model is built from a BertConfig, nothing is downloaded.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification, get_scheduler
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
torch.manual_seed(0)

SEQ, VOCAB = 16, 96
g = torch.Generator().manual_seed(1)
input_ids = torch.randint(1, VOCAB, (64, SEQ), generator=g)
lengths = torch.randint(6, SEQ, (64,), generator=g)
attention_mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
input_ids = input_ids * attention_mask  # pad with token 0
labels = (input_ids[:, 0] >= VOCAB // 2).long()
examples = [{"input_ids": input_ids[i], "attention_mask": attention_mask[i], "labels": labels[i]}
            for i in range(64)]
train_dataloader = DataLoader(examples, batch_size=8, shuffle=True)

config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=128, max_position_embeddings=SEQ, num_labels=2)
model = BertForSequenceClassification(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                             num_training_steps=2 * len(train_dataloader))
for epoch in range(2):
    model.train()
    for batch in train_dataloader:
        outputs = model(**batch)
        loss = outputs.loss
        loss.backward()  # expect: O101
        optimizer.step()
        lr_scheduler.step()
