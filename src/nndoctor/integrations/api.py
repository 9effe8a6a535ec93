"""``nndoctor.watch()``: observe training inside your own code or a notebook."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from nndoctor.core.engine import Session, StopRun
from nndoctor.core.findings import Report


@contextlib.contextmanager
def watch(
    *,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    max_steps: int | None = None,
    print_report: bool = False,
) -> Iterator[Report]:
    """Instrument the training that runs inside the ``with`` block.

    Yields the Report, which is complete when the block exits::

        with nndoctor.watch() as report:
            train(model, loader)
        for finding in report.findings:
            print(finding.code, finding.message)

    ``print_report`` prints the report when the block ends; in a Jupyter notebook it is one
    HTML block with plots, locations shown as "cell N, line M".
    ``max_steps`` ends the block quietly after that many optimizer steps. An exception
    raised by the block is explained in the report and then re-raised unchanged.
    """
    from nndoctor.core.selection import parse_codes
    from nndoctor.instrument.extensions import install
    from nndoctor.run.end import finish

    session = Session(select=parse_codes(list(select)), ignore=parse_codes(list(ignore)),
                      max_steps=max_steps)
    shell = _notebook_shell() if print_report else None
    if shell is not None:  # the notebook's report is one HTML block with plots
        from nndoctor.run.history import attach

        attach(session)
    installation = install(session)
    status, crash = "completed", None
    try:
        yield session.report
    except StopRun:
        status = "stopped"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except BaseException as error:
        status, crash = "crashed", error
        raise
    finally:
        finish(session, installation, status, crash)
        if shell is not None:
            from nndoctor.integrations.notebook import display_report

            display_report(session.report, shell)
        elif print_report:
            from nndoctor.report import print_report as show

            show(session.report)


def _notebook_shell():
    from nndoctor.integrations.notebook import notebook_shell

    return notebook_shell()
