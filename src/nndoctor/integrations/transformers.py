"""``nndoctor.integrations.transformers.DoctorCallback``: the doctor inside 🤗 ``Trainer.train``.

::

    from nndoctor.integrations.transformers import DoctorCallback
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

import logging
from typing import Any

from transformers import TrainerCallback

from nndoctor.core.findings import Severity
from nndoctor.integrations.base import DoctorCallbackBase, FindingsReachedFailOn, finding_line

__all__ = ["DoctorCallback", "FindingsReachedFailOn"]

log = logging.getLogger("transformers.nndoctor")


class DoctorCallback(DoctorCallbackBase, TrainerCallback):
    """Run nndoctor's checks during ``Trainer.train``; ``.report`` holds the result."""

    command = ("transformers", "Trainer.train")
    close_at_exit = True  # the Trainer has no exception hook

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
