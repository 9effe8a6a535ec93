"""``nndoctor fix --write --verify`` on a copy of every buggy fixture whose code has a codemod.

For each fixture (tests/fixtures/buggy and the Keras ones) marked ``# expect: CODE`` with CODE in
nndoctor.commands.fix.codemods.CODEMODS: copy it to a temporary folder, run ``nndoctor fix --write
--verify`` on the copy (in this process, through the CLI entry point; every check enabled;
``--unsafe-fixes`` for the unsafe codes), then run the doctor once more on the result. A fixture
counts as fixed when CODE is gone from that last run, no new error or warning appeared and the
script still completed with optimizer steps. Prints one line per fixture and the fraction fixed.

    PYTHONPATH=src python benchmarks/fix_fixtures.py [--only CODE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("KERAS_BACKEND", "torch")

from nndoctor.cli import main as nndoctor_main  # noqa: E402
from nndoctor.commands.fix.codemods import CODEMODS, codemod_for  # noqa: E402
from nndoctor.core.findings import Severity  # noqa: E402

FIXTURE_DIRS = [ROOT / "tests" / "fixtures" / "buggy", ROOT / "tests" / "fixtures" / "keras"]
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z][0-9]{3}(?:\s*,\s*[A-Z][0-9]{3})*)")


def fixtures(only: set[str] | None) -> list[tuple[Path, str]]:
    found = []
    for folder in FIXTURE_DIRS:
        for path in sorted(folder.glob("*.py")):
            codes = {c.strip() for m in _EXPECT.finditer(path.read_text()) for c in m.group(1).split(",")}
            for code in sorted(codes & set(CODEMODS)):
                if only is None or code in only:
                    found.append((path, code))
    return found


def fix_one(path: Path, code: str, workdir: Path) -> dict:
    """Fix a copy of ``path``; the verdict and what the edits became."""
    from tests.conftest import run_script

    copy = workdir / path.name
    shutil.copy(path, copy)
    before = run_script(copy)
    report_path = workdir / "fix.json"
    unsafe = [] if getattr(codemod_for(code), "SAFE", True) else ["--unsafe-fixes"]
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        started = time.perf_counter()
        nndoctor_main(["fix", "--write", "--verify", "--quiet", "--isolated", "--fail-on", "never",
                       *unsafe, "--json", str(report_path), copy.name])
        seconds = time.perf_counter() - started
    finally:
        os.chdir(cwd)
    edits = json.loads(report_path.read_text()).get("edits", [])
    after = run_script(copy)
    old = {(f.code, f.severity) for f in before.findings}
    new = [f for f in after.findings if f.severity >= Severity.WARNING and (f.code, f.severity) not in old]
    gone = not after.by_code(code)
    trains = after.status in ("completed", "stopped") and after.steps > 0
    return {"fixture": path.name, "code": code, "fixed": gone and not new and trains, "gone": gone,
            "new": [f.code for f in new], "trains": trains, "seconds": round(seconds, 1),
            "edits": [(e["code"], e["status"], e.get("reason", "")) for e in edits]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="only these codes")
    args = parser.parse_args()
    results = []
    for path, code in fixtures(set(args.only) if args.only else None):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = fix_one(path, code, Path(tmp))
            except Exception as error:  # noqa: BLE001 - one broken fixture must not hide the others
                result = {"fixture": path.name, "code": code, "fixed": False, "error": repr(error)}
        results.append(result)
        print(json.dumps(result), flush=True)
    fixed = sum(r["fixed"] for r in results)
    print(f"fixed {fixed} of {len(results)} fixtures ({fixed / max(1, len(results)):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
