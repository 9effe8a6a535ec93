"""`nndoctor explain` reads a pasted log without importing the frameworks: it loads only the
families that define crash explanations (the runtime checks import torch, seconds before the log
is even read), nor what ``nndoctor env`` needs to probe the install (packaging, subprocess)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests import childproc

LOG = Path(__file__).parent / "pasted" / "old_size_mismatch_no_header.txt"
CHILD = """
import contextlib, io, json, sys
from nndoctor.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
    code = main(["explain", sys.argv[1]])
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "tensorflow": "tensorflow" in sys.modules,
                  "env probes": "packaging" in sys.modules or "subprocess" in sys.modules,
                  "E105": "E105" in out.getvalue()}))
"""


def test_explain_imports_no_framework():
    done = childproc.run([sys.executable, "-c", CHILD, str(LOG)], timeout=120)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "torch": False, "tensorflow": False, "env probes": False, "E105": True}, done.stderr
