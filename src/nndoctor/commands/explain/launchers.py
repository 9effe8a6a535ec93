"""Launchers' reports that a child process failed: not a cause, a pointer to one.

``torchrun`` (torch.distributed.elastic) ends a failed job with its own traceback,
``torch.distributed.elastic.multiprocessing.errors.ChildFailedError``, whose message is a table
(``Root Cause (first observed failure): … exitcode: 1 … traceback: …``); ``accelerate launch``
and ``python -m torch.distributed.launch`` end with ``subprocess.CalledProcessError: Command
'[…python…]' returned non-zero exit status 1``. The real error is in the children's output
above it. ``explain`` drops these reports once it found a cause elsewhere in the log, and
reports them as "no known cause" when the log holds nothing else.
"""

from __future__ import annotations

import re

from nndoctor.commands.explain.crash import Crash

# A command that started Python or a launcher: a CalledProcessError about anything else
# (git, a compiler) is an error of its own.
_PYTHON_COMMAND = re.compile(r"python[\d.]*'|torchrun|accelerate|deepspeed|torch\.distributed\.(?:launch|run)")


def is_launcher_report(crash: Crash) -> bool:
    """Is ``crash`` a launcher saying that a child process failed?"""
    if crash.short_type == "ChildFailedError":
        return True
    return crash.short_type == "CalledProcessError" and bool(_PYTHON_COMMAND.search(crash.message.split("\n", 1)[0]))
