"""nndoctor.integrations.lightning.DoctorCallback inside Trainer.fit: catches a planted bug, silent when clean."""

from __future__ import annotations

import functools
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nndoctor.core.findings import Severity
from nndoctor.integrations.base import FindingsReachedFailOn
from tests.conftest import needs

# Lightning is imported by the tests, not at collection (every xdist worker collects this module;
# Lightning's import costs ~4 s).
pytestmark = needs("lightning")


@functools.cache
def _tiny_classifier() -> type:
    import lightning as L

    return type("TinyClassifier", (_TinyClassifierBody, L.LightningModule), {})


class _TinyClassifierBody:
    def __init__(self, softmax_before_loss: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.softmax_before_loss = softmax_before_loss

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        if self.softmax_before_loss:
            logits = logits.softmax(dim=-1)  # the planted bug: CrossEntropyLoss softmaxes again
        return F.cross_entropy(logits, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


def _callback(**options):
    from nndoctor.integrations.lightning import DoctorCallback

    return DoctorCallback(**options)


def _fit(tmp_path, callback, logger=False, **model_options):
    import lightning as L

    torch.manual_seed(0)
    trainer = L.Trainer(max_steps=12, accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[callback])
    trainer.fit(_tiny_classifier()(**model_options), _loader())
    return callback.report


def test_catches_softmax_before_cross_entropy(tmp_path, caplog):
    callback = _callback(quiet=True, json=str(tmp_path / "doctor.json"))
    from lightning.pytorch.loggers import CSVLogger

    csv = CSVLogger(tmp_path, name="logs")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.nndoctor"):
        report = _fit(tmp_path, callback, logger=csv, softmax_before_loss=True)
    assert report is not None and report.status == "completed" and report.steps == 12
    assert "L101" in report.codes()
    finding = report.by_code("L101")[0]
    assert finding.location is not None and finding.location.path.endswith("test_lightning.py")
    assert any("L101 softmax-before-cross-entropy" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "doctor.json").exists()
    import csv as csv_module

    rows = list(csv_module.DictReader(open(next((tmp_path / "logs").rglob("metrics.csv")))))
    errors = [float(r["nndoctor/errors"]) for r in rows if r.get("nndoctor/errors")]
    assert errors and errors[-1] == sum(1 for f in report.findings if f.severity == Severity.ERROR) >= 1


def test_silent_on_a_clean_fit(tmp_path):
    report = _fit(tmp_path, _callback(quiet=True))
    assert report is not None and report.steps == 12
    assert [f.code for f in report.findings if f.severity >= Severity.WARNING] == []
    assert not report.internal_errors


def test_fail_on_raises_after_the_fit(tmp_path):
    with pytest.raises(FindingsReachedFailOn, match="L101"):
        _fit(tmp_path, _callback(quiet=True, fail_on="error"), softmax_before_loss=True)
