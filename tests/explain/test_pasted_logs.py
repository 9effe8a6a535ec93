"""Real error logs as users paste them into issue trackers (tests/explain/pasted/*.txt).

Each file starts with a header: its public source, the catalog code decided from the thread's
answer before nndoctor was run on it (``none`` when no catalog code fits, ``nothing`` for a log
with no error whose only warning does not apply to the run), and the paste's format. Below
``---`` is the log. A log with a code must be explained by that code alone; a log with ``none``
must come out as "no known cause" and never with a guessed code; a log with ``nothing`` must
give no finding at all. A case whose
header says ``known-miss`` is one nndoctor still gets wrong, kept as a strict expected failure
so the hit rate stays honest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nndoctor.commands.explain.cli import explain_text
from tests.snapshot import assert_findings_snapshot

PASTED = Path(__file__).parent / "pasted"


def read_case(path: Path) -> tuple[dict[str, str], str]:
    header, _, log = path.read_text(encoding="utf-8").partition("\n---\n")
    fields = {}
    for line in header.splitlines():
        key, _, value = line.lstrip("# ").partition(":")
        fields[key.strip()] = value.strip()
    return fields, log


def outcome(log: str) -> str:
    """The code nndoctor names for ``log``, "none" for no known cause, "nothing" for no error and
    no cause found, or the codes joined by '+' when it names several."""
    findings, unexplained = explain_text(log)
    codes = sorted({f.code for f in findings})
    if codes:
        return "+".join(codes)
    return "none" if unexplained else "nothing"


CASES = sorted(PASTED.glob("*.txt"))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_pasted_log_gets_the_code_decided_from_its_thread(path):
    fields, log = read_case(path)
    assert fields["source"].startswith("https://github.com/"), "every case names its public source"
    found = outcome(log)
    if "known-miss" in fields:
        # Still missed, but honestly: no known cause, never a wrong code.
        assert found == "none", f"known miss now gives {found}: update its header"
        pytest.xfail(fields["known-miss"])
    assert fields["expected"] == found


def test_there_are_enough_real_logs():
    expected = [read_case(p)[0]["expected"] for p in CASES]
    assert len(expected) >= 100
    assert expected.count("none") >= 12  # logs whose honest answer is "no known cause"
    # Whole logs, not only Python exceptions: every family a log can show is represented.
    assert {code[0] for code in expected if code not in ("none", "nothing")} >= {"E", "V", "K", "X", "P"}


# The explanations README.md shows: a launcher/NCCL log and a log holding only a warning.
SNAPSHOTS = ("nccl_watchdog_pid_rank_prefix", "c10d_bind_warnings_no_exception",
             "dynamo_recompile_limit_warning_only", "keras_from_logits_softmax_warning_only")


@pytest.mark.parametrize("stem", SNAPSHOTS)
def test_log_line_explanations_read_as_recorded(stem):
    findings, unexplained = explain_text(read_case(PASTED / f"{stem}.txt")[1])
    assert not unexplained
    assert_findings_snapshot(f"explain/pasted_{stem}", findings, local_paths=False,
                             source=f"nndoctor explain tests/explain/pasted/{stem}.txt")


# README's explain section shows two of these snapshots (a launcher/NCCL log, a warning-only log):
# what it prints must be what the tool prints, so the section cannot drift from the snapshots.
README_EXAMPLES = ("nccl_watchdog_pid_rank_prefix", "dynamo_recompile_limit_warning_only")


@pytest.mark.parametrize("stem", README_EXAMPLES)
def test_readme_shows_the_recorded_explanation(stem):
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    snapshot = (Path(__file__).parents[1] / "snapshots" / "explain" / f"pasted_{stem}.txt").read_text(encoding="utf-8")
    rendered = snapshot.split("\n", 2)[2].strip("\n")  # below the "# nndoctor explain …" header
    assert "```\n$ nndoctor explain " in readme and f"\n{rendered}\n```" in readme, stem
