"""Hostile input for ``nndoctor explain``: logs with thousands of (chained) tracebacks, special
files, and escape sequences in error messages. Also the sanitize helper the reporters share."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import files_harness as h  # noqa: E402

from nndoctor.commands.explain.cli import MAX_CHAINS_ANALYSED, explain_all  # noqa: E402
from nndoctor.commands.explain.tracetext import parse_crashes  # noqa: E402
from nndoctor.util.sanitize import printable  # noqa: E402

CHAIN = "\nDuring handling of the above exception, another exception occurred:\n\n"
ERRORS = [
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x{i} and 5x6)",
    "ValueError: bad value {i}",
    "KeyError: 'key{i}'",
]


def traceback_text(i: int) -> str:
    return (f"step {i} loss 0.25\nTraceback (most recent call last):\n"
            f'  File "train.py", line {i % 90 + 1}, in <module>\n    main()\n'
            f'  File "train.py", line 12, in main\n    out = model(x)\n'
            + ERRORS[i % len(ERRORS)].format(i=i) + "\n")


def big_log(count: int, *, chained: bool, size: int) -> str:
    """``count`` tracebacks, padded to about ``size`` characters with ordinary log lines in front."""
    body = (CHAIN if chained else "").join(traceback_text(i) for i in range(count))
    filler_lines = max(0, size - len(body)) // 100
    return "".join(f"epoch 0 batch {n:08d} {'.' * 77}\n" for n in range(filler_lines)) + body


# -- 9. cost linear in the size of the log ------------------------------------------------------
def test_chained_tracebacks_do_not_copy_the_whole_chain():
    text = big_log(4000, chained=True, size=1_200_000)
    chains = parse_crashes(text)
    assert len(chains) == 1 and len(chains[0]) == 4000
    # Each link keeps a bounded part of its cause: total text stays proportional to the input.
    assert sum(len(crash.text) for crash in chains[0]) < 20 * len(text)


def test_many_distinct_tracebacks_are_capped_and_counted():
    text = big_log(3000, chained=False, size=600_000)
    result = explain_all(text)
    assert result.tracebacks == 3000
    assert result.not_analysed == 3000 - MAX_CHAINS_ANALYSED
    assert result.findings  # the shape mismatches are still explained
    assert len(result.unexplained) <= MAX_CHAINS_ANALYSED


def test_identical_tracebacks_are_explained_once():
    one = traceback_text(7).split("\n", 1)[1]  # without the "step" line, which differs per step
    text = "".join(one for _ in range(2000))
    result = explain_all(text)
    assert result.tracebacks == 2000 and result.not_analysed == 0
    assert len(result.findings) + len(result.unexplained) == 1


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> dict[str, h.Limited]:
    folder = tmp_path_factory.mktemp("hostile-explain")
    cases = {}
    for chained in (False, True):
        path = folder / f"log-{'chained' if chained else 'flat'}.txt"
        path.write_text(big_log(20_000, chained=chained, size=6_000_000))
        assert 5_900_000 < path.stat().st_size < 6_100_000
        cases["chained" if chained else "flat"] = ("explain", path, "--json", folder / f"{path.stem}.json")
    cases["device"] = ("explain", "/dev/zero")
    cases["socket-or-device-link"] = ("explain", _link(folder, "/dev/urandom"))
    return dict(zip(cases, h.run_limited(list(cases.values()), cwd=folder)))


def _link(folder: Path, target: str) -> Path:
    path = folder / "random.log"
    os.symlink(target, path)
    return path


@pytest.mark.parametrize("case", ["flat", "chained"])
def test_6mb_log_with_20000_tracebacks_is_explained_quickly(limited, case):
    result = limited[case]
    assert result.code in (0, 1), result.err
    assert result.seconds < h.TIME_LIMIT_S
    assert result.json["extra"]["tracebacks"] == (1 if case == "chained" else 20_000)
    if case == "flat":
        assert "counted, not analysed" in result.err


@pytest.mark.parametrize("case", ["device", "socket-or-device-link"])
def test_devices_are_refused_not_read(limited, case):
    result = limited[case]
    assert result.code == 2 and "not a regular file or pipe" in result.err
    assert result.seconds < h.TIME_LIMIT_S


# -- 4. escape sequences -----------------------------------------------------------------------
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\rback\x08\x9b1m"


def test_escape_sequences_in_an_unexplained_error_are_shown_escaped(tmp_path, capsys):
    from nndoctor.cli import main

    log = tmp_path / "log.txt"
    log.write_text("Traceback (most recent call last):\n"
                   f'  File "train{HOSTILE}.py", line 3, in <module>\n    go()\n'
                   f"ZzzUnknownError: {HOSTILE}\n")
    json_path = tmp_path / "r.json"
    code = main(["explain", str(log), "--json", str(json_path)])
    out, err = capsys.readouterr()
    assert code == 1
    h.assert_no_raw_controls(out + err)
    assert "\\e]0;owned\\x07" in out
    import json

    unexplained = json.loads(json_path.read_text())["extra"]["unexplained"][0]
    assert unexplained["message"] == HOSTILE.splitlines()[0]  # JSON keeps the raw value


# -- the shared helper -------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "shown"), [
    ("plain text", "plain text"),
    ("\x1b[31mred", "\\e[31mred"),
    ("\x1b]0;title\x07", "\\e]0;title\\x07"),
    ("a\rb\x08c\x7fd", "a\\rb\\x08c\\x7fd"),
    ("csi\x9b1m", "csi\\x9b1m"),
    ("bidi\u202eevil", "bidi\\u202eevil"),
    ("tab\tand\nline", "tab\tand\nline"),
    ("ünïcödé 日本", "ünïcödé 日本"),
])
def test_printable_escapes_every_control_character(raw, shown):
    assert printable(raw) == shown
    h.assert_no_raw_controls(printable(raw, keep_newlines=False, keep_tabs=False))


def test_printable_single_line_mode():
    assert printable("a\nb\tc", keep_newlines=False, keep_tabs=False) == "a\\nb\\tc"
