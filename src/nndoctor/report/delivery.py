"""Where a run's report goes (``--json PATH``, the terminal), fixed before the script runs.

Shared by ``nndoctor run``, ``demo`` and ``perf``: the JSON path is checked and made absolute
up front (a bad path is a usage error before a long run, not a lost report after it, and a
script's ``os.chdir`` cannot move it); the report is written to nndoctor's own streams, which
the script cannot close or redirect (``nndoctor.run.streams``). ``deliver`` is also what an abrupt
ending (SIGTERM, ``os._exit``) calls.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable, Iterable
from typing import IO

from nndoctor.core.findings import Report
from nndoctor.run.streams import OriginalStreams
from nndoctor.util.atomic import describe_write_error, prepare_output_path


class ReportDelivery:
    """The report's destinations for one command."""

    def __init__(self, json_arg: str | None, *, quiet: bool = False,
                 args: argparse.Namespace | None = None, also_scan: Iterable[str] = (),
                 text_stream: str = "stderr") -> None:
        self.json_shown = json_arg  # as the user typed it, for the terminal
        self.json_path = prepare_output_path(json_arg) if json_arg else None
        self.quiet = quiet
        # The other outputs (--output-format, --sarif, --html, --tensorboard, suppressions).
        self.args = args if args is not None else argparse.Namespace(json=json_arg, quiet=quiet)
        self.also_scan = list(also_scan)
        # Commands that run a script print to stderr (the script owns stdout); data, ckpt and
        # explain print their report on stdout.
        self.text_stream = text_stream
        self.streams = OriginalStreams()
        self.json_failed = False
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @classmethod
    def from_args(cls, args: argparse.Namespace, also_scan: Iterable[str] = (),
                  text_stream: str = "stderr") -> ReportDelivery:
        """From the command's options; ``args.json`` becomes absolute too, so every other writer
        of the report (a watchdog, a per-rank merge) is immune to the script's ``os.chdir``."""
        delivery = cls(getattr(args, "json", None), quiet=bool(getattr(args, "quiet", False)), args=args,
                       also_scan=also_scan, text_stream=text_stream)
        if delivery.json_path:
            args.json = delivery.json_path
        return delivery

    def deliver(self, report: Report, preamble: Iterable[str] = (),
                render_text: Callable[[IO[str], str | None], None] | None = None) -> None:
        """Write the JSON report and every other requested output, and print the terminal
        report (never raises for I/O).

        Only the process that started the run delivers: a child the script forked with
        ``os.fork()`` that runs on to the end of the script owns no report (and must not
        overwrite its parent's)."""
        if os.getpid() != self._pid:
            return
        from nndoctor.report.outputs import deliver

        with self._lock:
            self.streams.restore()
            self.streams.flush_stdout()
            try:
                deliver(report, self.args, getattr(self.streams, self.text_stream), stdout=self.streams.stdout,
                        json_writer=self._write_json_once, preamble=preamble, also_scan=self.also_scan,
                        render_text=render_text)
            except (OSError, ValueError):
                pass  # nndoctor's own stderr is gone (closed pipe): the JSON report is what is left

    def _write_json_once(self, report: Report) -> bool:
        self.write_json(report)
        return not self.json_failed

    def write_json(self, report: Report) -> None:
        if not self.json_path:
            return
        from nndoctor.report.json_report import write_json

        try:
            write_json(report, self.json_path, stdout=self.streams.stdout)
        except OSError as error:
            self.json_failed = True
            self._say(describe_write_error(self.json_shown or self.json_path, error))
        except Exception as error:  # noqa: BLE001 - a script that patched os/json must not get our traceback
            self.json_failed = True
            self._say(describe_write_error(self.json_shown or self.json_path,
                                           OSError(f"internal error {type(error).__name__}: {error}")))

    def _say(self, line: str) -> None:
        try:
            self.streams.stderr.write(line + "\n")
            self.streams.stderr.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        self.streams.close()
