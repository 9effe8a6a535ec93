"""accelerate's nlp_example structure, on a tiny BERT built from a config and synthetic tokens.

As in the example: the optimizer and the linear warmup scheduler are built before
``accelerator.prepare()`` and passed to it; the loss is divided by the accumulation count;
every epoch ends with ``model.eval()`` and a ``torch.no_grad()`` evaluation with
``gather_for_metrics``. Single process on the CPU, offline.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()

SEQ, VOCAB = 16, 64


def token_batches(count, seed, batch_size, shuffle):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (count, SEQ), generator=g)
    labels = (ids[:, 0] >= VOCAB // 2).long()  # the first token decides
    rows = [{"input_ids": i, "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": y}
            for i, y in zip(ids, labels)]
    return DataLoader(rows, batch_size=batch_size, shuffle=shuffle)


def training_function(lr=2e-3, num_epochs=4, batch_size=4, gradient_accumulation_steps=2):
    accelerator = Accelerator(cpu=True)
    set_seed(42)
    train_dataloader = token_batches(64, 1, batch_size, shuffle=True)
    eval_dataloader = token_batches(32, 2, 16, shuffle=False)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=SEQ, num_labels=2)
    model = BertForSequenceClassification(config).to(accelerator.device)
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=2,
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps,
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss / gradient_accumulation_steps
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
        model.eval()
        correct = total = 0
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            correct += (predictions == references).sum().item()
            total += references.numel()
        accelerator.print(f"epoch {epoch}: accuracy {correct / total:.3f}")


if __name__ == "__main__":
    training_function()
