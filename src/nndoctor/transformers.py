"""``nndoctor.transformers.DoctorCallback``: the doctor inside 🤗 ``Trainer.train``.

::

    from nndoctor.transformers import DoctorCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[DoctorCallback()])
    trainer.train()

The same checks as ``nndoctor run`` observe training from ``on_train_begin`` to
``on_train_end``; each finding is logged through transformers' logging
(``transformers.nndoctor``, so ``transformers.logging.set_verbosity_*`` applies) when it
appears, and the report is printed at the end. Options mirror the CLI: ``select``,
``ignore``, ``fail_on`` (raise ``FindingsReachedFailOn`` at the end), ``json``, ``sarif``,
``html``, ``tensorboard``, ``output_format``, ``quiet``.

The Trainer has no exception hook: if ``train()`` raises, the doctor is closed (and its
report written) the next time this callback starts, or at interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Iterable
from typing import Any

from transformers import TrainerCallback

from nndoctor.findings import Report, Severity
from nndoctor.integration import DoctorOptions, DoctorRun, FindingsReachedFailOn, finding_line

__all__ = ["DoctorCallback", "FindingsReachedFailOn"]

log = logging.getLogger("transformers.nndoctor")


class DoctorCallback(TrainerCallback):
    """Run nndoctor's checks during ``Trainer.train``; ``.report`` holds the result."""

    def __init__(
        self,
        *,
        select: Iterable[str] = (),
        ignore: Iterable[str] = (),
        fail_on: str | None = None,
        json: str | None = None,
        sarif: str | None = None,
        html: str | None = None,
        tensorboard: str | None = None,
        output_format: str = "text",
        quiet: bool = False,
    ) -> None:
        options = DoctorOptions(select=select, ignore=ignore, fail_on=fail_on, json=json, sarif=sarif,
                                html=html, tensorboard=tensorboard, output_format=output_format, quiet=quiet)
        self._run = DoctorRun(options, ["transformers", "Trainer.train"])
        self.report: Report | None = None
        reference = weakref.ref(self)  # atexit must not keep every callback alive
        atexit.register(lambda: (callback := reference()) is not None and callback._close_abandoned())

    def _close_abandoned(self) -> None:
        if self._run.running:  # train() raised: no hook told us
            self.report = self._run.finish("crashed")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_abandoned()
        self._run.start()

    def _log_new(self) -> None:
        for finding in self._run.new_findings():
            log.log(logging.WARNING if finding.severity >= Severity.WARNING else logging.INFO,
                    finding_line(finding))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._log_new()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._run.running:
            return
        self.report = self._run.finish("completed")
        self._log_new()
        self._run.check_fail_on()
