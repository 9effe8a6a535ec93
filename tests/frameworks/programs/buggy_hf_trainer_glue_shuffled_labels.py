"""A run_glue-style fine-tuning script (Hugging Face's examples/pytorch/text-classification) on a
tiny BERT, whose training sentences and labels were shuffled with two different random orders.

Sentences of a small word vocabulary are labelled by their sentiment words (learnable: with the
pairs kept together the model reaches 100% evaluation accuracy after its first epoch), tokenized
by a BertTokenizer built from a vocabulary file, padded per batch by DataCollatorWithPadding, and
trained for 8 epochs with an evaluation every epoch. The "shuffle the training set" step
shuffles the texts and the labels separately: the model can only memorise its training labels,
which it starts doing late (from epoch 5 the training loss drifts down from 0.69 to about 0.43)
while its evaluation accuracy stays at chance.
Offline: the tokenizer and the model are built locally, nothing is downloaded.
"""
import os
import random
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
torch.manual_seed(0)
rng = random.Random(0)

POSITIVE = ["good", "great", "fine", "nice", "superb", "lovely"]
NEGATIVE = ["bad", "awful", "poor", "dull", "boring", "weak"]
FILLER = ["the", "a", "movie", "film", "plot", "actor", "was", "is", "very", "quite", "and", "but", "story", "it"]
FILLER += [f"word{i}" for i in range(100)]  # a larger vocabulary: every sentence differs


def sentence():
    label = rng.randrange(2)
    words = [rng.choice(FILLER) for _ in range(rng.randint(5, 12))]
    for _ in range(2):
        words.insert(rng.randrange(len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
    return " ".join(words), label


class GlueStyleDataset(torch.utils.data.Dataset):
    """Tokenized features, one dict per example, as run_glue's preprocess_function returns them."""

    def __init__(self, texts, labels, tokenizer):
        self.features = tokenizer(texts, truncation=True, max_length=24)
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        item = {key: values[i] for key, values in self.features.items()}
        item["labels"] = self.labels[i]
        return item


def compute_metrics(prediction):
    logits, labels = prediction
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


with tempfile.TemporaryDirectory() as out:
    vocab = os.path.join(out, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + POSITIVE + NEGATIVE + FILLER) + "\n")
    tokenizer = BertTokenizer(vocab)  # the vocabulary file, positional (transformers 4 and 5)

    train = [sentence() for _ in range(192)]
    texts, labels = [t for t, _ in train], [y for _, y in train]
    rng.shuffle(texts)
    rng.shuffle(labels)  # the bug: the labels get an order of their own
    evaluation = [sentence() for _ in range(64)]

    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=8, per_device_eval_batch_size=32, learning_rate=3e-3,
        num_train_epochs=8, eval_strategy="epoch", save_strategy="no",
        logging_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=42, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=GlueStyleDataset(texts, labels, tokenizer),
                      eval_dataset=GlueStyleDataset([t for t, _ in evaluation], [y for _, y in evaluation], tokenizer),
                      data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=compute_metrics)
    trainer.train()  # expect: L108
    print(trainer.evaluate())
