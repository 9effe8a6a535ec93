"""Records what the correct training programs print (stdout and stderr, as a terminal shows them
together), for test_correct_outputs.py: ``nndoctor explain`` must find no cause in any of them.

Each program runs as users run it, ``python PROGRAM`` without nndoctor, from the repository root;
the Keras ones on the TensorFlow backend with TensorFlow's own log lines left on (its start-up
warnings are what a pasted Keras log begins with), the DDP one under torchrun with two ranks
(its launcher lines and gloo's are part of the output). A program that does not exit 0 is reported
and not recorded: a correct program must finish.

    PYTHONPATH=src:. python -m tests.explain.record_correct_outputs            # all of them
    PYTHONPATH=src:. python -m tests.explain.record_correct_outputs NAME...    # some (file stems)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = Path(__file__).parent / "correct_outputs"
TIMEOUT_S = 600


def correct_programs() -> list[Path]:
    fixtures = ROOT / "tests" / "fixtures"
    return sorted([*(fixtures / "correct").glob("*.py"), *(fixtures / "keras").glob("correct_*.py"),
                   fixtures / "distributed" / "ddp_correct.py"])


def recording_name(program: Path) -> str:
    return f"{program.parent.name}__{program.stem}.txt"


def environment(program: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]), OMP_NUM_THREADS="1")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    if program.parent.name == "keras":
        env["KERAS_BACKEND"] = "tensorflow"
    return env


def command(program: Path, out_dir: str) -> list[str]:
    """How users run ``program``: python, or torchrun with two ranks for the distributed ones
    (``out_dir`` receives their checkpoint)."""
    relative = program.relative_to(ROOT).as_posix()
    if program.parent.name == "distributed":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", relative, out_dir]
    return [sys.executable, relative]


def run(program: Path) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as out_dir:
        return subprocess.run(command(program, out_dir), cwd=ROOT, env=environment(program), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace", timeout=TIMEOUT_S, check=False)


def record(program: Path) -> bool:
    relative = program.relative_to(ROOT).as_posix()
    done = run(program)
    if done.returncode != 0:
        print(f"{relative}: exit {done.returncode}, not recorded\n{done.stdout[-2000:]}", file=sys.stderr)
        return False
    backend = "  (KERAS_BACKEND=tensorflow)" if program.parent.name == "keras" else ""
    shown = " ".join(["python", *command(program, "OUT_DIR")[1:]])
    header = f"# program: {relative}\n# command: {shown}{backend}\n# exit: 0\n---\n"
    target = OUTPUTS / recording_name(program)
    partial = target.with_suffix(".part")
    partial.write_text(header + done.stdout, encoding="utf-8")
    partial.replace(target)
    print(f"{relative}: {len(done.stdout.splitlines())} lines")
    return True


def main(names: list[str]) -> int:
    OUTPUTS.mkdir(exist_ok=True)
    programs = [p for p in correct_programs() if not names or p.stem in names]
    failed = [p for p in programs if not record(p)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
