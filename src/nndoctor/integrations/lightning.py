"""``nndoctor.integrations.lightning.DoctorCallback``: the doctor inside ``Trainer.fit`` (Lightning).

::

    from nndoctor.integrations.lightning import DoctorCallback
    trainer = L.Trainer(callbacks=[DoctorCallback(fail_on="warning", html="doctor.html")])
    trainer.fit(model, datamodule)

The same checks as ``nndoctor run`` observe the fit (from ``setup`` to ``teardown``); each
finding is logged through Lightning's logger (``lightning.pytorch.nndoctor``) when it
appears, counts per severity go to the trainer's loggers (``log_metrics``), findings as
text to a TensorBoard logger, and the report is printed at the end. Options mirror the
CLI: ``select``, ``ignore``, ``fail_on`` (raise ``FindingsReachedFailOn`` at the end),
``json``, ``sarif``, ``html``, ``tensorboard``, ``output_format``, ``quiet``.
"""

from __future__ import annotations

import logging
from typing import Any

from nndoctor.core.findings import Severity
from nndoctor.integrations.base import DoctorCallbackBase, FindingsReachedFailOn, finding_line

try:
    from lightning.pytorch.callbacks import Callback
except ModuleNotFoundError:  # the standalone package
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]  # the same class, other package

__all__ = ["DoctorCallback", "FindingsReachedFailOn"]

log = logging.getLogger("lightning.pytorch.nndoctor")


class DoctorCallback(DoctorCallbackBase, Callback):
    """Run nndoctor's checks during ``Trainer.fit``; ``.report`` holds the result."""

    command = ("lightning", "Trainer.fit")

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._run.start()

    def _log_new(self, trainer: Any) -> None:
        for finding in self._run.new_findings():
            level = logging.WARNING if finding.severity >= Severity.WARNING else logging.INFO
            log.log(level, finding_line(finding))
            for logger in getattr(trainer, "loggers", []) or []:
                add_text = getattr(getattr(logger, "experiment", None), "add_text", None)
                if callable(add_text):
                    add_text(f"nndoctor/{finding.code}", finding_line(finding), trainer.global_step)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._log_new(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        status = "interrupted" if isinstance(exception, KeyboardInterrupt) else "crashed"
        self.report = self._run.finish(status, exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or not self._run.running:
            return
        self.report = self._run.finish("completed")
        self._log_new(trainer)
        if self.report is not None:
            counts = {f"nndoctor/{s.label}s": float(sum(1 for f in self.report.findings if f.severity == s))
                      for s in Severity}
            for logger in getattr(trainer, "loggers", []) or []:
                logger.log_metrics(counts, step=trainer.global_step)
            log.info("nndoctor: %d finding(s), %d suppressed", len(self.report.findings),
                     len(self.report.suppressed))
        self._run.check_fail_on()
