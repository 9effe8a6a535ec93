"""nndoctor.integrations.transformers.DoctorCallback inside 🤗 Trainer.train on a tiny BERT built from its
config (nothing downloaded): catches a planted bug, silent on a clean run."""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from nndoctor.core.findings import Severity
from tests.conftest import needs

# 🤗 Trainer is imported by the tests, not at collection (every xdist worker collects this module;
# the import costs seconds).
pytestmark = needs("transformers")


def _callback(**options):
    from nndoctor.integrations.transformers import DoctorCallback

    return DoctorCallback(**options)


@functools.cache
def softmax_loss_trainer() -> type:
    import transformers

    return type("SoftmaxLossTrainer", (_SoftmaxLoss, transformers.Trainer), {})


class _SoftmaxLoss:
    """The planted bug: a custom loss that softmaxes the logits before cross_entropy."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits.softmax(dim=-1), labels)
        return (loss, outputs) if return_outputs else loss


def _dataset(n: int = 64):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (n, 12), generator=generator)
    labels = (ids[:, 0] % 3)
    return [{"input_ids": ids[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": labels[i]}
            for i in range(n)]


def _train(tmp_path, callback, trainer_class=None):
    import transformers

    trainer_class = trainer_class or transformers.Trainer
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=10, per_device_train_batch_size=8, learning_rate=1e-3,
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, use_cpu=True, seed=0)
    trainer = trainer_class(model=model, args=args, train_dataset=_dataset(), callbacks=[callback])
    trainer.train()
    return callback.report


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_catches_softmax_before_cross_entropy(tmp_path):
    callback = _callback(quiet=True, sarif=str(tmp_path / "doctor.sarif"))
    logger, records = logging.getLogger("transformers.nndoctor"), _Records()
    logger.addHandler(records)  # transformers' loggers do not propagate to the root logger
    # Other programs in this process may have lowered transformers' verbosity (set_verbosity_error):
    # the callback's own logger level decides here.
    level, logger.level = logger.level, logging.INFO
    try:
        report = _train(tmp_path, callback, softmax_loss_trainer())
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert report is not None and report.status == "completed" and report.steps == 10
    assert "L101" in report.codes()
    assert report.by_code("L101")[0].location.path.endswith("test_transformers.py")
    assert any("L101 softmax-before-cross-entropy" in m for m in records.messages)
    assert (tmp_path / "doctor.sarif").exists()


def test_silent_on_a_clean_run(tmp_path):
    report = _train(tmp_path, _callback(quiet=True))
    assert report is not None and report.steps == 10
    assert [(f.code, f.message) for f in report.findings if f.severity >= Severity.WARNING] == []
    assert not report.internal_errors
