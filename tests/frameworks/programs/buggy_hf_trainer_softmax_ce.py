"""A Trainer subclass whose compute_loss applies softmax before cross-entropy (double softmax).

The tiny BERT classifier (built from a config) returns logits; the custom ``compute_loss``
turns them into probabilities and hands those to ``F.cross_entropy``, which applies
log_softmax again.
"""
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
torch.manual_seed(0)
SEQ, VOCAB = 16, 64


def token_rows(count, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (count, SEQ), generator=g)
    labels = (ids >= VOCAB // 2).sum(1).gt(SEQ // 2).long()
    return [{"input_ids": i, "labels": y} for i, y in zip(ids, labels)]


class ProbabilityTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        probabilities = F.softmax(outputs.logits, dim=-1)
        loss = F.cross_entropy(probabilities, labels)  # expect: L101
        return (loss, outputs) if return_outputs else loss


config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ, num_labels=2)
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, num_train_epochs=1,
                             learning_rate=1e-3, save_strategy="no", logging_strategy="no",
                             report_to="none", disable_tqdm=True, use_cpu=True, seed=0)
    trainer = ProbabilityTrainer(model=BertForSequenceClassification(config), args=args,
                                 train_dataset=token_rows(64, 1))
    trainer.train()
